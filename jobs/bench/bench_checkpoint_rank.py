"""One rank of the checkpoint benchmark (`bench_checkpoint.py`): FSDP2 LLaMA on gloo, trained
with one checkpoint method at a time. Every method saves the same sharded model + AdamW state
and the same extra state (the step and the rank's RNG state), built inside the timed call.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from ray_resilience._internal.checkpoint.rank.rank_checkpointer import RankCheckpointer
from ray_resilience._internal.checkpoint.rank.snapshot import state_dict_of
from ray_resilience.examples.llama import PRESETS, build_model, causal_lm_loss


def _local(value: Any) -> Any:
    if isinstance(value, DTensor):
        return value.to_local()
    if isinstance(value, dict):
        return {k: _local(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_local(v) for v in value]
    return value


def _extra(step: int) -> dict[str, Any]:
    return {"step": step, "rng": torch.get_rng_state()}


def _full_state(rank: Any, step: int) -> dict[str, Any]:
    return {**state_dict_of(rank.model, rank.optimizer), "extra": _extra(step)}


class _Saver:
    """Sync methods: the whole save blocks; the latency is the blocking time."""

    def __init__(self, rank: Any, folder: str) -> None:
        self.rank, self.folder, self.latencies, self.held_bytes = rank, folder, [], 0

    def finish(self) -> None:
        pass


class TorchSave(_Saver):
    def save(self, step: int) -> None:
        start = time.perf_counter()
        state = _local(_full_state(self.rank, step))
        with open(os.path.join(self.folder, f"rank{self.rank.rank}.pt"), "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())  # durable, as DCP's writer and ours are
        self.latencies.append(time.perf_counter() - start)


class DcpSync(_Saver):
    def save(self, step: int) -> None:
        start = time.perf_counter()
        dcp.save(_full_state(self.rank, step), checkpoint_id=self.folder)
        self.latencies.append(time.perf_counter() - start)


class DcpAsync(_Saver):
    """DCP `async_save` as torchtitan drives it: wait for the previous save before the next."""

    def __init__(self, rank: Any, folder: str) -> None:
        super().__init__(rank, folder)
        self.future: Any = None

    def save(self, step: int) -> None:
        self.finish()
        started = time.perf_counter()
        self.future = dcp.async_save(_full_state(self.rank, step),
                                     checkpoint_id=self.folder, process_group=self.rank.ckpt_group)
        self.future.add_done_callback(
            lambda _: self.latencies.append(time.perf_counter() - started))
        self.held_bytes = self.rank.state_bytes()  # the default stager keeps a full CPU copy

    def finish(self) -> None:
        if self.future is not None:
            self.future.result()
            self.future = None


class Ours(_Saver):
    def save(self, step: int) -> None:
        self.rank.ckpt.save(step, model=self.rank.model, optimizer=self.rank.optimizer,
                            extra=_extra(step))

    def finish(self) -> None:
        self.rank.ckpt.wait_idle(600)
        stats = self.rank.ckpt.stats()
        self.latencies = stats["durable_latency_s"]
        self.held_bytes = stats["staging_bytes"]


SAVERS = {"torch_save": TorchSave, "dcp_sync": DcpSync, "dcp_async": DcpAsync}


class BenchRank:
    """A rank; methods are called on all ranks at once (collectives inside)."""

    def __init__(self, rank: int, world_size: int, port: int, preset: str) -> None:
        torch.set_num_threads(1)
        self.rank, self.world_size, self.preset = rank, world_size, preset
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size)
        self.ckpt_group = dist.new_group(backend="gloo")  # async_save's own collectives
        self.model = build_model(preset, seed=0)
        for layer in self.model.layers:
            fully_shard(layer)
        fully_shard(self.model)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.ckpt: Any = None
        self.step = 0
        self._train_step()  # materializes the optimizer state

    def state_bytes(self) -> int:
        flat = _local(state_dict_of(self.model, self.optimizer))
        total = sum(v.numel() * v.element_size() for v in flat["model"].values())
        for entry in flat["optimizer"]["state"].values():
            total += sum(v.numel() * v.element_size() for v in entry.values() if torch.is_tensor(v))
        return total

    def attach(self, spec: Any) -> None:
        if self.ckpt is not None:
            self.ckpt.close()
        self.ckpt = RankCheckpointer(spec, rank=self.rank, world_size=self.world_size)

    def _train_step(self) -> None:
        self.step += 1
        seq = min(64, PRESETS[self.preset].max_seq_len)
        gen = torch.Generator().manual_seed(self.step * 100 + self.rank)
        tokens = torch.randint(0, PRESETS[self.preset].vocab_size, (2, seq + 1), generator=gen)
        causal_lm_loss(self.model(tokens[:, :-1]), tokens[:, 1:]).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def run(self, method: str, interval: int, num_steps: int, folder: str) -> dict[str, Any]:
        """Trains `num_steps`, saving every `interval` steps with `method` ("none": never)."""
        if method != "none" and not method.startswith("ours"):
            os.makedirs(folder, exist_ok=True)
        saver_cls = Ours if method.startswith("ours") else SAVERS.get(method, _Saver)
        saver = saver_cls(self, folder)
        dist.barrier()
        blocking, blocking_cpu, start = [], [], time.perf_counter()
        for i in range(1, num_steps + 1):
            self._train_step()
            if blocking and method.startswith("ours"):
                # Ours copies while the next forward/backward run; the optimizer step waits for
                # the copy if it is not done. That wait is blocking of the save before it.
                blocking[-1] += self.ckpt.take_guard_wait_s()
            if method != "none" and i % interval == 0:
                t0, c0 = time.perf_counter(), time.thread_time()
                saver.save(self.step)
                blocking.append(time.perf_counter() - t0)
                # CPU the training thread itself spent in the save: the rest of the blocking
                # time it waited (for the GIL, a lock, or a core another process held).
                blocking_cpu.append(time.thread_time() - c0)
        wall = time.perf_counter() - start
        saver.finish()
        dist.barrier()
        if self.rank == 0 and method in SAVERS:
            shutil.rmtree(folder, ignore_errors=True)
        stats = self.ckpt.stats() if method.startswith("ours") else {}
        phases = {k: sorted(v)[len(v) // 2]
                  for k, v in stats.get("phases_s", {}).items() if v}
        guard = stats.get("guard_wait_s", [])
        return {"phases_median_s": phases, "blocking_s": blocking, "blocking_cpu_s": blocking_cpu,
                "wall_s": wall,
                "guard_waits": len(guard), "guard_wait_max_s": max(guard, default=0.0),
                "latency_s": list(saver.latencies), "held_bytes": saver.held_bytes,
                "skipped": stats.get("skipped", 0), "coalesced": stats.get("coalesced", 0),
                "failed": stats.get("failed", 0)}

    def stats_internal(self) -> dict:
        return self.ckpt.stats()

    def close(self) -> None:
        if self.ckpt is not None:
            self.ckpt.close()
        dist.destroy_process_group()
