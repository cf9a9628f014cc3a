"""One rank of the checkpoint benchmark: FSDP2 LLaMA on gloo in a Ray actor, trained with one
checkpoint method at a time (`savers.py`); methods are called on every rank at once."""

from __future__ import annotations

import os
import resource
import shutil
import time
from typing import Any

import ray
import torch
import torch.distributed as dist
from harness.sizes import size
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.fsdp import fully_shard

from ray_resilience._internal.checkpoint.rank.rank_checkpointer import RankCheckpointer
from ray_resilience._internal.checkpoint.wire import SnapshotSource
from ray_resilience.examples.llama import build_model, causal_lm_loss

from .savers import _local, make_saver

WARM_UP_SAVES = 2
"""Untimed saves before the timed steps: ours reaches its steady state (its writer keeps the
newest snapshot in the memory tier and gives the one before back to stage into) at the second."""


def _usage() -> dict[str, float]:
    """This process's CPU seconds and page faults, and the whole machine's busy CPU seconds
    (every process's: the writers', DCP's checkpoint daemons', Ray's)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    with open("/proc/stat", encoding="utf-8") as f:
        ticks = [int(v) for v in f.readline().split()[1:]]
    busy = sum(ticks) - ticks[3] - ticks[4]
    return {"cpu_s": me.ru_utime + me.ru_stime, "minflt": me.ru_minflt,
            "majflt": me.ru_majflt, "machine_cpu_s": busy / os.sysconf("SC_CLK_TCK")}


class BenchRank(SnapshotSource):
    """Built by the driver as a Ray actor; `run` trains `steps` steps with one method."""

    def __init__(self, rank: int, world_size: int, port: int, size_name: str) -> None:
        torch.set_num_threads(1)
        self.rank, self.world_size, self.size = rank, world_size, size(size_name)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size)
        torch.manual_seed(17 + rank)
        self.model = build_model(self.size.model, seed=0)
        for layer in self.model.layers:
            fully_shard(layer)
        fully_shard(self.model)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.ckpt: Any = None
        self.step = 0
        self._train_step()
        self._optimizer_step()  # materializes the optimizer state

    def state_bytes(self) -> int:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        tensors = [*_local(model_sd).values(),
                   *(v for entry in _local(optim_sd["state"]).values() for v in entry.values())]
        return sum(t.numel() * t.element_size() for t in tensors if torch.is_tensor(t))

    def attach(self, spec: Any) -> None:
        """Ours' checkpointer as the product's rank actor builds it: its writer takes each
        snapshot from this actor (adopting the shared staging slot, no copy)."""
        self.detach()
        self.ckpt = RankCheckpointer(spec, rank=self.rank, world_size=self.world_size,
                                     exporter=ray.get_runtime_context().current_actor)

    def snapshot_source(self) -> RankCheckpointer | None:
        return self.ckpt

    def detach(self) -> None:
        """Closes ours' checkpointer (its optimizer-step guard goes with it)."""
        if self.ckpt is not None:
            self.ckpt.close()
            self.ckpt = None

    def _train_step(self) -> None:
        self.step += 1
        gen = torch.Generator().manual_seed(self.step * 100 + self.rank)
        tokens = torch.randint(0, self.size.model.vocab_size,
                               (self.size.batch_size, self.size.seq_len + 1), generator=gen)
        causal_lm_loss(self.model(tokens[:, :-1]), tokens[:, 1:]).backward()

    def _optimizer_step(self) -> float:
        """The optimizer step; returns how long ours' snapshot guard held it."""
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return self.ckpt.take_guard_wait_s() if self.ckpt is not None else 0.0

    def run(self, method: str, interval: int, steps: int, folder: str,
            shm_root: str) -> dict[str, Any]:
        """Trains `steps` steps saving every `interval` with `method` ("none": never), after
        WARM_UP_SAVES untimed saves, each durable before the next (every method's one-time
        set-up stays out of the numbers, and each starts timing with the buffers it keeps: ours
        stages into the memory its writer gave back after the second). Steps are numbered on
        from the warm-up saves (1..WARM_UP_SAVES): the timed ones are WARM_UP_SAVES+1 on."""
        os.makedirs(folder, exist_ok=True)
        saver = make_saver(method, self, folder, shm_root)
        for warm_up in range(1, WARM_UP_SAVES + 1):
            self._train_step()
            saver.before_optimizer_step()
            self._optimizer_step()
            saver.save(warm_up)
            saver.settle()  # durable: no method's warm-up write lands in the timed steps
        dist.barrier()
        usage0 = _usage()
        blocking, step_times, saved, start = [], [], 0, time.time()
        for n in range(1, steps + 1):
            i = WARM_UP_SAVES + n
            self._train_step()
            waited = saver.before_optimizer_step()
            waited += self._optimizer_step()
            if blocking:
                blocking[-1] += waited  # the wait belongs to the save before it
            step_times.append((i, time.time()))
            if method != "none" and n % interval == 0:
                t0 = time.time()
                saved += saver.save(i)
                blocking.append(time.time() - t0)
        wall = time.time() - start
        usage = {k: v - usage0[k] for k, v in _usage().items()}
        saver.finish()
        dist.barrier()
        if self.rank == 0 and not method.startswith("ours"):  # ours': after its last commit
            shutil.rmtree(folder, ignore_errors=True)
        stats = self.ckpt.stats() if method.startswith("ours") else {}
        return {"blocking_s": blocking, "wall_s": wall, "t_start": start,
                "step_times": step_times,
                "commits": [c for c in saver.commits if c[0] > WARM_UP_SAVES],
                "requested": len(blocking), "saved": saved, "held_bytes": saver.held_bytes,
                "coalesced": stats.get("coalesced", 0), "skipped": stats.get("skipped", 0),
                "usage": usage}

    def staging_bytes(self) -> int:
        """Shared memory ours' checkpointer holds for its next snapshots (spares included)."""
        return 0 if self.ckpt is None else self.ckpt.stats()["staging_bytes"]

    def close(self) -> None:
        self.detach()
        dist.destroy_process_group()
