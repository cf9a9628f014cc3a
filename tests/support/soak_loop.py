"""Train function for the in-process restart soak: one FSDP step per attempt, then a fault.

Measurements live in a module global: the process (and this module) survive every attempt.
"""

from __future__ import annotations

import os
import threading

import torch
from torch.distributed.fsdp import fully_shard

import ray_resilience as rr
from ray_resilience.examples.llama import build_model, causal_lm_loss

SAMPLES: dict[int, dict[str, int]] = {}


def _fd_targets() -> list[str]:
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            targets.append(f"{fd}->{os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:  # closed while listing (the listing's own descriptor)
            pass
    return sorted(targets)


def _usage() -> dict:
    with open("/proc/self/statm") as f:
        rss_pages = int(f.read().split()[1])
    targets = _fd_targets()
    return {"rss": rss_pages * os.sysconf("SC_PAGE_SIZE"), "fds": len(targets),
            "fd_targets": targets,
            "threads": threading.active_count(),
            "thread_names": sorted(t.name for t in threading.enumerate())}


def soak(cfg: dict) -> dict:
    ctx = rr.get_context()
    SAMPLES[ctx.attempt] = _usage()  # before this attempt builds anything
    model = build_model("tiny", seed=0)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.arange(2 * 33).reshape(2, 33) % 256
    causal_lm_loss(model(tokens[:, :-1]), tokens[:, 1:]).backward()
    optimizer.step()
    rr.report({"attempt": ctx.attempt}, step=ctx.attempt + 1)  # progress every attempt
    if ctx.attempt < cfg["restarts"]:
        if ctx.world_rank == ctx.attempt % ctx.world_size:
            raise RuntimeError(f"soak fault {ctx.attempt}")
        torch.distributed.barrier()  # the other rank blocks here until it is interrupted
    return {"samples": dict(SAMPLES), "pid": os.getpid()}
