"""Train function for the in-process restart soaks: one FSDP step per attempt, then a fault.

Measurements live in a module global: the process (and this module) survive every attempt. With
`cfg["checkpoint"]`, each attempt restores the newest checkpoint (the local tier), saves its step
and waits until the save is durable before the fault; rank 0 also samples every control-plane
process of the run (supervisor, commit coordinator, writers: its raylet's other children) and the
run's local-tier files, at the same point of every attempt (its start).
"""

from __future__ import annotations

import glob
import os
import threading

import psutil
import torch
from torch.distributed.fsdp import fully_shard

import ray_resilience as rr
from ray_resilience.examples.llama import build_model, causal_lm_loss

SAMPLES: dict[int, dict] = {}
CONTROL_PLANE = ("ray::Supervisor", "ray::CommitCoordinator", "ray::CheckpointWriter")


def _fd_targets(pid: int | str = "self") -> list[str]:
    targets = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            targets.append(f"{fd}->{os.readlink(f'/proc/{pid}/fd/{fd}')}")
        except OSError:  # closed while listing (the listing's own descriptor)
            pass
    return sorted(targets)


def _rss(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _usage() -> dict:
    targets = _fd_targets()
    return {"rss": _rss(), "fds": len(targets), "fd_targets": targets,
            "threads": threading.active_count(),
            "thread_names": sorted(t.name for t in threading.enumerate())}


def _control_plane() -> dict[str, dict[str, int]]:
    """RSS and descriptors of the run's other actor processes, by role and pid."""
    found = {}
    for proc in psutil.Process(os.getppid()).children():
        try:
            title = (proc.cmdline() or [""])[0]
            role = next((r for r in CONTROL_PLANE if title.startswith(r)), None)
            if role is not None:
                found[f"{role[5:]}:{proc.pid}"] = {"rss": _rss(proc.pid),
                                                    "fds": len(_fd_targets(proc.pid))}
        except (psutil.Error, OSError):  # ended meanwhile
            continue
    return found


def _local_files(checkpointer) -> dict[str, int]:
    paths = [p for p in glob.glob(f"{checkpointer.spec.local_root}-*/*") if os.path.isfile(p)]
    return {"files": len(paths), "bytes": sum(os.path.getsize(p) for p in paths)}


def soak(cfg: dict) -> dict:
    from ray_resilience import context  # noqa: PLC0415 - the rank's own checkpointer

    ctx = rr.get_context()
    checkpointer = context._session.checkpointer
    sample = _usage()  # before this attempt builds anything
    if cfg.get("checkpoint") and ctx.world_rank == 0:
        sample.update(control_plane=_control_plane(), local=_local_files(checkpointer))
    SAMPLES[ctx.attempt] = sample
    model = build_model("tiny", seed=0)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loaded = rr.load_checkpoint(model=model, optimizer=optimizer) if cfg.get("checkpoint") \
        else None
    step = (loaded.step if loaded is not None else ctx.attempt) + 1
    tokens = torch.arange(2 * 33).reshape(2, 33) % 256
    causal_lm_loss(model(tokens[:, :-1]), tokens[:, 1:]).backward()
    optimizer.step()
    save = rr.CheckpointState(model, optimizer, extra={"step": step}) \
        if cfg.get("checkpoint") else None
    rr.report({"attempt": ctx.attempt}, step=step, checkpoint=save)  # progress every attempt
    if save is not None:
        assert checkpointer.wait_idle(120), "the save did not become durable"
    if ctx.attempt < cfg["restarts"]:
        if ctx.world_rank == ctx.attempt % ctx.world_size:
            raise RuntimeError(f"soak fault {ctx.attempt}")
        torch.distributed.barrier()  # the other rank blocks here until it is interrupted
    return {"samples": dict(SAMPLES), "pid": os.getpid(),
            "resumed_from": loaded.step if loaded is not None else None}
