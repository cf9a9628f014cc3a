"""Interleaved repetitions of every arm at one size, and what they add up to.

Every repetition runs each arm once, in an order rotated by one every repetition, so a drift of
the shared machine's speed spreads over all arms. Each run is isolated in its own runner process
(`sweep.runner`) with a private Ray. Beside medians over repetitions, each arm's cost against
another is also taken per repetition (runs next to each other in time) and the median of those
ratios kept: it cancels most of the drift the medians still see.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from collections.abc import Callable
from typing import Any

from harness.sizes import size as size_of
from harness.spec import PHASES_FILE, Workload
from scoring.stats import summary
from sweep.isolated import run_isolated
from sweep.machine import touch_cost, write_cost

from ray_resilience.examples.token_data import generate_shards

from .accounting import account
from .arms import SETTINGS, Arm
from .startup import SEGMENTS, split
from .steps import FIELDS, LATE, run_costs

KINDS = (*(f"{name}_{stat}_s" for name in FIELDS for stat in ("median", "mean")), LATE)
RAY_START_TIMEOUT = "timed out during startup"
"""Ray's head gives its raylet a fixed 30 s to register: a loaded machine misses it."""
START_TRIES = 3


def _rotated(arms: list[Arm], by: int) -> list[Arm]:
    by %= len(arms)
    return arms[by:] + arms[:by]


def run_size(size_name: str, arms: list[Arm], *, reps: int, work_dir: str,
             timeout_s: float, log: Callable[[str], None]) -> dict[str, Any]:
    """Runs every arm `reps` times at `size_name`; the size's result document."""
    size, setting = size_of(size_name), SETTINGS[size_name]
    root = os.path.join(work_dir, size_name)
    data = os.path.join(root, "data")
    generate_shards(data, seq_len=size.seq_len, vocab_size=size.model.vocab_size)
    base = Workload(size=size_name, max_steps=setting.steps, world_size=2, data_dir=data,
                    run_dir=root, detect_timeout_s=size.detect_timeout_s)
    costs = {"before": _write_costs(root)}
    runs: list[dict[str, Any]] = []
    for rep in range(reps):
        for arm in _rotated(arms, rep):
            runs.append(_one(arm, base, setting, rep, len(runs), root, timeout_s))
            log(_line(runs[-1]))
    costs["after"] = _write_costs(root)
    log(f"  writing a new file costs {costs['before']['storage']['cpu_s_per_gb']} / "
        f"{costs['after']['storage']['cpu_s_per_gb']} CPU-s per GB on the checkpoints' disk "
        f"(before / after), {costs['after']['tmpfs']['cpu_s_per_gb']} on /dev/shm; first touch "
        f"of new memory {costs['before']['memory']['first_cpu_s_per_gb']} / "
        f"{costs['after']['memory']['first_cpu_s_per_gb']} CPU-s per GB")
    return {"size": size_name, "state_bytes_per_rank": size.state_bytes_per_rank,
            "write_cost": costs,
            "steps": setting.steps, "warmup_steps": setting.warmup,
            "durable_every": setting.durable_every, "local_every": setting.local_every,
            "arms": {a.name: _arm_summary(a.name, runs) for a in arms},
            "paired": _paired(arms, runs), "runs": runs}


def _write_costs(root: str) -> dict[str, Any]:
    """The machine's cost of writing new files where the runs' checkpoints go (their run
    folders under `root`) and on the local tier's tmpfs, and of touching new memory."""
    return {"storage": write_cost(root), "storage_direct": write_cost(root, direct=True),
            "tmpfs": write_cost("/dev/shm"), "memory": touch_cost()}


def _one(arm: Arm, base: Workload, setting: Any, rep: int, index: int, root: str,
         timeout_s: float) -> dict[str, Any]:
    run_dir = os.path.join(root, f"{index:03d}-{arm.name.replace('@', '-')}")
    local_root = f"/dev/shm/rrbench-oh-{os.getpid()}-{index:03d}"
    workload = arm.workload(base.with_(run_dir=run_dir, local_root=local_root,
                                       snapshot_steps=(setting.warmup, setting.steps - 1)),
                            setting)
    for _ in range(START_TRIES):
        shutil.rmtree(run_dir, ignore_errors=True)
        load_start, t0 = os.getloadavg()[0], time.time()
        result = run_isolated(arm.mechanism, workload, timeout_s=timeout_s, paths=arm.paths)
        if RAY_START_TIMEOUT not in (result.get("error") or ""):
            break
    ok = result["status"] == "ok"
    costs = run_costs(run_dir, setting.warmup) if ok else None
    launched = (result.get("timeline") or {}).get("t_start")
    startup = split(run_dir, launched) if ok and launched else None
    for name in ("checkpoints", "storage"):
        shutil.rmtree(os.path.join(run_dir, name), ignore_errors=True)
    return {"arm": arm.name, "rep": rep, "status": result["status"], "error": result.get("error"),
            "load_average_start": round(load_start, 2),
            "load_average_end": round(os.getloadavg()[0], 2),
            "run_s": round(time.time() - t0, 1), "usage": result.get("usage"),
            "costs": costs, "startup": startup,
            "accounting": account(run_dir) if ok else None,
            "local_interval_steps": _local_interval(run_dir),
            "durable_saves": durable_saves(result, before_step=setting.steps),
            "run_dir": run_dir}


DURABLE = (None, "storage")
"""Timeline tiers of committed (durable) checkpoints; "local" is the node-local tier."""


def durable_saves(result: dict[str, Any], *, before_step: int) -> dict[str, int] | None:
    """Committed checkpoints asked for and committed in a run (from its result's timeline) at
    the steps before `before_step`, so the page shows every saving arm did the same work while
    it trained (a save ours coalesced or dropped is work it did not do; ours also saves the last
    step, after the measured steps, which the launcher loop does not). None for a run without
    a timeline."""
    timeline = result.get("timeline")
    if not timeline or not isinstance(timeline.get("saves"), list):
        return None
    return {kind: sum(1 for event in timeline[key]
                      if event.get("tier") in DURABLE and event["step"] < before_step)
            for kind, key in (("requested", "saves"), ("committed", "commits"))}


def _local_interval(run_dir: str) -> int | None:
    """The local tier's interval ours chose (None: another mechanism, or the tier off)."""
    try:
        with open(os.path.join(run_dir, PHASES_FILE), encoding="utf-8") as f:
            return json.load(f).get("local_interval_steps")
    except (OSError, ValueError):
        return None


def _arm_summary(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    mine = [r for r in runs if r["arm"] == name and r["costs"]]
    return {"ok": len(mine), "runs": sum(r["arm"] == name for r in runs),
            "load_average": summary([r["load_average_start"] for r in mine]),
            **{kind: summary([r["costs"][kind] for r in mine if kind in r["costs"]])
               for kind in KINDS},
            "startup": {name: summary([r["startup"][name] for r in mine if r["startup"]])
                        for name in (*SEGMENTS, "total")}}


def _paired(arms: list[Arm], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per kind, `a` against `b` for every ordered pair: the median over repetitions of
    (a's value / b's value - 1), each ratio within one repetition."""
    by_rep: dict[int, dict[str, dict[str, float]]] = {}
    for r in runs:
        if r["costs"]:
            by_rep.setdefault(r["rep"], {})[r["arm"]] = r["costs"]
    out: dict[str, Any] = {}
    for a in arms:
        for b in arms:
            if a is b:
                continue
            ratios = {kind: [rep[a.name][kind] / rep[b.name][kind] - 1.0
                             for rep in by_rep.values() if a.name in rep and b.name in rep
                             and rep[a.name].get(kind) is not None
                             and rep[b.name].get(kind)] for kind in KINDS}
            out[f"{a.name} vs {b.name}"] = {
                kind: {"median": statistics.median(v), "min": min(v), "max": max(v),
                       "n": len(v)} if v else None for kind, v in ratios.items()}
    return out


def _line(run: dict[str, Any]) -> str:
    c = run["costs"]
    if not c:
        return f"  {run['arm']:<22} rep {run['rep']} {run['status']}: {run['error']}"
    return (f"  {run['arm']:<22} rep {run['rep']} step {1e3 * c['wall_median_s']:.1f} ms "
            f"(mean {1e3 * c['wall_mean_s']:.1f}), thread CPU {1e3 * c['thread_cpu_median_s']:.1f}"
            f" ms, process CPU {1e3 * c['process_cpu_median_s']:.1f} ms, load "
            f"{run['load_average_start']}-{run['load_average_end']}, {run['run_s']} s"
            + (f", local every {run['local_interval_steps']}" if run["local_interval_steps"]
               else ""))
