"""Test harness for checkpoint tests: FSDP2 ranks as small Ray actors with a real gloo group.

Each `RankActor` builds the tiny LLaMA sharded with `fully_shard`, an AdamW optimizer and a
`RankCheckpointer`, and trains on deterministic batches, so two runs that start from the same
state end bit-equal.

Starting two ranks costs ~10 s here (two processes importing torch on two cores), so the ranks
`start_with` hands out are reused across tests and modules: `stop_ranks` closes their checkpointer
and parks them; the next `start_with` rebuilds model and optimizer from the seed in the same
processes (and process group), checks the group with a collective, and attaches the new
service. Ranks that fail that check are killed and replaced by fresh ones.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import socket
import threading
from typing import Any

import ray
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from ray_resilience._internal.checkpoint.rank.rank_checkpointer import (
    COPY_DELAY_ENV_VAR,
    RankCheckpointer,
)
from ray_resilience._internal.checkpoint.wire import SnapshotSource
from ray_resilience.examples.llama import build_model, causal_lm_loss

VOCAB = 256


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    rows = torch.randint(0, VOCAB, (2, 17), generator=gen)
    return rows[:, :-1], rows[:, 1:]


class RankActor(SnapshotSource):
    """One rank. Methods run on the actor's thread; all ranks must call collectives together."""

    def __init__(self, rank: int, world_size: int, port: int, spec: Any, preset: str = "tiny",
                 copy_delay_s: float = 0.0) -> None:
        os.environ[COPY_DELAY_ENV_VAR] = str(copy_delay_s)
        torch.set_num_threads(1)
        self.rank, self.world_size = rank, world_size
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size)
        self._build(preset)
        self.ckpt = self._checkpointer(spec) if spec else None

    def _checkpointer(self, spec: Any) -> RankCheckpointer:
        """As the product's rank builds it: its writer takes snapshots from this actor."""
        return RankCheckpointer(spec, rank=self.rank, world_size=self.world_size,
                                exporter=ray.get_runtime_context().current_actor)

    def snapshot_source(self) -> RankCheckpointer | None:
        return self.ckpt

    def _build(self, preset: str) -> None:
        self.model = build_model(preset, seed=0)
        for layer in self.model.layers:
            fully_shard(layer)
        fully_shard(self.model)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.step = 0

    def attach(self, spec: Any, copy_delay_s: float | None = None) -> None:
        """Starts checkpointing with `spec` (for ranks started before their service)."""
        if copy_delay_s is not None:
            os.environ[COPY_DELAY_ENV_VAR] = str(copy_delay_s)
        self.ckpt = self._checkpointer(spec)

    def detach(self) -> None:
        """Closes the checkpointer and drops the model: the rank is parked for reuse."""
        if self.ckpt is not None:
            self.ckpt.close()
        self.ckpt = self.model = self.optimizer = None
        gc.collect()

    def reset(self, preset: str) -> float:
        """A parked rank starts over: the model and optimizer from the seed, then one
        all-reduce over the process group (every rank must call it), whose sum it returns."""
        self._build(preset)
        value = torch.ones(1)
        dist.all_reduce(value)
        return float(value.item())

    def train(self, num_steps: int, *, save: bool = True) -> list[float | None]:
        blocked = []
        for _ in range(num_steps):
            self.step += 1
            inputs, targets = batch(self.step, self.rank)
            loss = causal_lm_loss(self.model(inputs), targets)
            loss.backward()
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if save and self.ckpt is not None:
                blocked.append(self.ckpt.maybe_save(self.step, model=self.model,
                                                    optimizer=self.optimizer, extra=self.extra()))
        return blocked

    def thread_policies(self) -> dict[str, int]:
        """Scheduling policy of every Python thread of this rank, by name ("caller": this one)."""
        found = {t.name: os.sched_getscheduler(t.native_id) for t in threading.enumerate()}
        found["caller"] = os.sched_getscheduler(0)
        return found

    def extra(self) -> dict[str, Any]:
        return {"step": self.step, "rng": torch.get_rng_state(), "note": ("rank", self.rank)}

    def save(self, step: int) -> float | None:
        self.step = step
        return self.ckpt.save(step, model=self.model, optimizer=self.optimizer, extra=self.extra())

    def save_then_mutate(self, step: int, how: str = "optimizer") -> dict[str, torch.Tensor]:
        """Full state at save time (gathered), then, right after `save` returns, every parameter
        and moment changes: through `optimizer.step()` ("optimizer", which must wait for the
        snapshot copy) or by in-place writes the checkpointer cannot see coming ("inplace")."""
        expected = self.full_state()
        self.save(step)
        if how == "optimizer":
            for p in self.model.parameters():
                p.grad = torch.ones_like(p)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                for p in self.model.parameters():
                    p.add_(1.0)
                for state in self.optimizer.state.values():
                    for value in state.values():
                        if torch.is_tensor(value) and value.dim() > 0:
                            value.add_(1.0)
        changed = self.full_state()
        same = [k for k in expected
                if torch.equal(expected[k], changed[k]) and not k.endswith(".step")]
        assert not same, f"the mutation left {same[:3]} unchanged"
        return expected

    def replace_storage(self) -> None:
        """Moves the first parameter's `exp_avg` shard into new storage (same values, same
        tensor object): from now on training updates the new storage only."""
        value = self.optimizer.state[next(iter(self.model.parameters()))]["exp_avg"]
        local = value._local_tensor if isinstance(value, DTensor) else value
        local.data = local.data.clone()

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def full_state(self) -> dict[str, torch.Tensor]:
        options = StateDictOptions(full_state_dict=True, cpu_offload=False)
        model = get_model_state_dict(self.model, options=options)
        optim = get_optimizer_state_dict(self.model, self.optimizer, options=options)
        out = {f"model.{k}": v.clone() for k, v in model.items()}
        for fqn, state in optim["state"].items():
            out.update({f"optimizer.state.{fqn}.{k}": v.clone() for k, v in state.items()})
        return out

    def load(self) -> dict[str, Any] | None:
        loaded = self.ckpt.load(model=self.model, optimizer=self.optimizer)
        if loaded is None:
            return None
        self.step = loaded.step
        return {"step": loaded.step, "tier": loaded.tier, "path": loaded.path,
                "extra": loaded.extra, "fallbacks": list(loaded.fallbacks),
                "replica": loaded.replica}

    def stock_load(self, path: str) -> dict[str, torch.Tensor]:
        """Loads with plain `torch.distributed.checkpoint.load` (no ray_resilience code) at this
        world size, then returns the full state."""
        state = {"model": get_model_state_dict(self.model),
                 "optimizer": get_optimizer_state_dict(self.model, self.optimizer)}
        dcp.load(state, checkpoint_id=path)
        set_model_state_dict(self.model, state["model"])
        set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])
        return self.full_state()

    def wait_idle(self, timeout_s: float = 120.0) -> bool:
        return self.ckpt.wait_idle(timeout_s)

    def stats(self) -> dict[str, Any]:
        return self.ckpt.stats()

    def scribble_own_memory(self) -> int:
        """Overwrites every staging buffer this rank may still write (its spares and free slots
        it did not give away); returns how many bytes."""
        pool = self.ckpt._pipeline.pool
        with self.ckpt._pipeline.cond:
            arrays = [b.array for b in pool.spares]
            arrays += [s.buffers.data for s in pool.slots
                       if s.state.name == "FREE" and not s.given_away]
            for array in arrays:
                array[:] = 0xFF
        return sum(a.nbytes for a in arrays)

    def shared_mapped_bytes(self) -> int:
        """Bytes of checkpoint shared memory (ours' memfds) this process maps now."""
        total = 0
        with open("/proc/self/maps", encoding="utf-8") as f:
            for line in f:
                if "ray_resilience-checkpoint" in line:
                    start, end = (int(x, 16) for x in line.split()[0].split("-"))
                    total += end - start
        return total

    def close_checkpointer(self) -> int:
        """Closes the checkpointer with Python's cycle collector off; the checkpoint shared
        memory this process still maps right after."""
        gc.disable()
        try:
            self.ckpt.close()
            return self.shared_mapped_bytes()
        finally:
            gc.enable()

    def close(self) -> None:
        if self.ckpt is not None:
            self.ckpt.close()
        if dist.is_initialized():
            dist.destroy_process_group()

    def pid(self) -> int:
        return os.getpid()


def start_ranks(specs: list[Any], *, preset: str = "tiny", world_size: int | None = None,
                copy_delay_s: float = 0.0) -> list[Any]:
    """Starts one RankActor per spec (or `world_size` ranks without checkpointing); the
    background snapshot copy of each save starts `copy_delay_s` late."""
    world_size = world_size or len(specs)
    specs = specs or [None] * world_size
    port = free_port()
    # No CPU reserved: parked ranks must not keep a later test's actors from being scheduled.
    # Threads: a test's call, and the writer taking a snapshot while that call waits on a save.
    actor = ray.remote(RankActor).options(num_cpus=0, max_concurrency=4)
    return [actor.remote(rank, world_size, port, specs[rank], preset, copy_delay_s)
            for rank in range(world_size)]


@dataclasses.dataclass
class _Group:
    """Ranks `start_with` handed out in this test session; `parked` between two tests."""

    preset: str
    ranks: list[Any]
    parked: bool = False


_groups: list[_Group] = []


def _unpark(world_size: int, preset: str) -> list[Any] | None:
    """Parked ranks of that size and preset, reset and checked; None if there are none."""
    for group in [g for g in _groups
                  if g.parked and g.preset == preset and len(g.ranks) == world_size]:
        try:
            if on_all(group.ranks, "reset", preset, timeout=60) == [float(world_size)] * world_size:
                group.parked = False
                return group.ranks
        except Exception:  # noqa: BLE001 - a broken group: fresh ranks instead
            pass
        stop_ranks(group.ranks, kill=True)
    return None


def start_with(service_factory: Any, *, world_size: int = 2, preset: str = "tiny",
               copy_delay_s: float = 0.0) -> tuple[Any, list[Any]]:
    """Ranks (parked ones of this session, else new) and their checkpoint service
    (`service_factory()`, started while new ranks start), each rank attached to it; the
    background snapshot copy of each save starts `copy_delay_s` late."""
    ranks = _unpark(world_size, preset)
    if ranks is None:
        ranks = start_ranks([], world_size=world_size, preset=preset)
        _groups.append(_Group(preset, ranks))
    try:
        service = service_factory()
        ray.get([r.attach.remote(service.rank_spec(i), copy_delay_s) for i, r in enumerate(ranks)],
                timeout=150)
    except BaseException:
        stop_ranks(ranks, kill=True)
        raise
    return service, ranks


def on_all(ranks: list[Any], method: str, *args: Any, timeout: float = 150.0,
           **kwargs: Any) -> list[Any]:
    """Calls `method` on every rank at once (collectives inside) and returns the results."""
    return ray.get([getattr(r, method).remote(*args, **kwargs) for r in ranks], timeout=timeout)


def stop_ranks(ranks: list[Any], *, kill: bool = False) -> None:
    """Parks ranks from `start_with` (their checkpointer closed) unless `kill`; kills the
    others. Parked ranks are left alone by a second call."""
    group = next((g for g in _groups if g.ranks == list(ranks)), None)
    if group is not None and not kill:
        if group.parked:
            return
        try:
            on_all(ranks, "detach", timeout=60)
            group.parked = True
            return
        except Exception:  # noqa: BLE001 - not reusable: killed below
            pass
    if group is not None:
        _groups.remove(group)
    _kill(ranks)


def _kill(ranks: list[Any]) -> None:
    try:
        ray.get([r.close.remote() for r in ranks], timeout=60)
    except Exception:  # noqa: BLE001 - killed below either way
        pass
    for r in ranks:
        ray.kill(r)


def drain_parked() -> None:
    """Kills the session's ranks (at its end)."""
    while _groups:
        _kill(_groups.pop().ranks)
