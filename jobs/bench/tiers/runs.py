"""The runs of one size: the defaults with the local tier off (the per-step baseline), the
defaults (the local tier on, an exception), and with the local tier off an exception restored
from writer memory, then with the memory tier off too, from storage. Each through
`ResilientTrainer` on a private Ray."""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from typing import Any

from harness.ray_session import private_ray
from harness.sizes import Size

import ray_resilience as rr
from ray_resilience.checkpoint import CheckpointConfig
from ray_resilience.testing import Fault, FaultPlan

from .loop import train_loop

STEPS = {"tiny": 120, "200mb": 40, "1gb": 24}
"""Steps per run: past the probe and at least one chosen interval where the step time allows."""


@dataclasses.dataclass(frozen=True)
class Plan:
    name: str
    local: bool
    memory_tier: bool
    fault_step: int | None
    checkpoint_interval: int


def plans(steps: int) -> list[Plan]:
    """The fault comes 6 steps before the end; the committed save a sixth of the run before it,
    so it is committed by then even on a loaded machine."""
    fault = steps - 6
    save = fault - max(4, steps // 6)
    return [Plan("off", False, True, None, 0), Plan("auto", True, True, fault, 0),
            Plan("memory", False, True, fault, save),
            Plan("storage", False, False, fault, save)]


def run(shape: Size, plan: Plan, *, steps: int, data_dir: str, out_dir: str) -> dict[str, Any]:
    """One `fit()` and what it measured."""
    checkpoint = CheckpointConfig(interval_steps=plan.checkpoint_interval,
                                  memory_tier=plan.memory_tier,
                                  **({} if plan.local else {"local_interval_steps": 0}))
    faults = FaultPlan.explicit([Fault(step=plan.fault_step, rank=1, kind="exception")]) \
        if plan.fault_step else None
    resilience = rr.ResilienceConfig.default(checkpoint=checkpoint, fault_plan=faults,
                                             step_timeout_s=shape.detect_timeout_s * 4,
                                             first_step_timeout_s=600.0)
    trainer = rr.ResilientTrainer(
        train_loop, train_loop_config={"size": shape.name, "steps": steps, "data_dir": data_dir},
        scaling_config=rr.ScalingConfig(num_workers=2),
        run_config=rr.RunConfig(name=f"tiers-{shape.name}-{plan.name}-{int(time.time())}",
                                storage_path=out_dir, verbose=False),
        resilience=resilience)
    with private_ray(num_cpus=4):
        result = trainer.fit()
    return summarize(result, plan, steps)


def summarize(result: rr.Result, plan: Plan, steps: int) -> dict[str, Any]:
    report = result.goodput
    fault = report.faults[0] if report is not None and report.faults else None
    local = (result.checkpoint or {}).get("local_tier") or {}
    window = (10, (plan.fault_step or steps) - 1)
    return {
        "plan": dataclasses.asdict(plan), "ok": result.ok,
        "error": None if result.ok else str(result.error), "wall_s": result.wall_s,
        "step_s": step_seconds(result.metrics_history, *window), "window": list(window),
        "interval_steps": result.local_interval_steps, "local_cost_s": local.get("cost_s"),
        "local_step_s": local.get("step_s"), "state_bytes": local.get("state_bytes"),
        "local_off": local.get("off"), "decisions": local.get("decisions"),
        "local_snapshots": report.num_local_snapshots if report else None,
        "local_blocking_s": report.local_snapshot_blocking_s if report else None,
        "restore_s": (result.checkpoint or {}).get("restore_s"),
        "fault": None if fault is None else {
            "tier": fault.checkpoint_tier, "load_s": fault.checkpoint_load_s,
            "recovery_s": fault.recovery_s, "steps_redone": fault.steps_redone,
            "step": fault.step_at_fault, "resumed_from": fault.resumed_from_step},
    }


def step_seconds(history: list[dict[str, Any]], first: int, last: int) -> float | None:
    """Rank 0's median wall seconds per step over steps (first, last] of the first attempt."""
    times = {m["step"]: m["time"] for m in history
             if m["rank"] == 0 and m["attempt"] == 0 and first <= m["step"] <= last}
    gaps = [times[s] - times[s - 1] for s in sorted(times) if s - 1 in times]
    return statistics.median(gaps) if gaps else None


def checksum_rates(nbytes: int = 256 * 2**20) -> dict[str, float]:
    """GB/s of the local tier's checksum (and of zlib's CRC-32, its fallback) on this CPU."""
    import zlib  # noqa: PLC0415 - only this measurement

    import crc32c  # noqa: PLC0415 - only this measurement
    import numpy as np  # noqa: PLC0415 - only this measurement

    data = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    rates = {}
    for name, fn in (("crc32c", crc32c.crc32c), ("zlib_crc32", zlib.crc32)):
        best = min(_timed(fn, data) for _ in range(3))
        rates[name] = nbytes / best / 1e9
    return rates


def _timed(fn: Any, data: Any) -> float:
    t0 = time.perf_counter()
    fn(data)
    return time.perf_counter() - t0


def shm_left(prefix: str) -> list[str]:
    root = os.path.join("/dev/shm", "ray_resilience")
    return [n for n in os.listdir(root) if n.startswith(prefix)] if os.path.isdir(root) else []
