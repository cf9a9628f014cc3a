"""Per-step cost of one run from its ranks' step events: wall time, the training thread's CPU
time and the whole rank process's CPU time per step (`harness.events.EventLog.step`).

Wall time on a shared machine moves with everyone else's load; CPU time moves much less (only
through cache and preemption effects), so both are kept. Process CPU minus training-thread CPU is
what every other thread of the rank used per step: gloo's, Ray's, and ours.
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any

from harness.events import read_events

FIELDS = {"wall": "t", "thread_cpu": "thread_cpu_s", "process_cpu": "cpu_s"}
LATE = "wall_late_mean_s"
"""The mean wall time per step over the second half of the measured steps."""


def rank_steps(run_dir: str) -> dict[int, list[dict[str, Any]]]:
    """Each rank's step events in step order (the last event of a step that ran twice)."""
    by_rank: dict[int, dict[int, dict[str, Any]]] = {}
    for e in read_events(run_dir):
        if e["ev"] == "step":
            by_rank.setdefault(e["rank"], {})[e["step"]] = e
    return {r: [steps[s] for s in sorted(steps)] for r, steps in sorted(by_rank.items())}


def per_step(events: list[dict[str, Any]], warmup: int) -> dict[str, list[float]]:
    """Seconds per step of each FIELDS kind over consecutive steps after the first `warmup`."""
    kept = [e for e in events if e["step"] > warmup]
    out: dict[str, list[float]] = {name: [] for name in FIELDS}
    for a, b in itertools.pairwise(kept):
        if b["step"] != a["step"] + 1 or any(key not in a for key in FIELDS.values()):
            continue
        for name, key in FIELDS.items():
            out[name].append(b[key] - a[key])
    return out


def run_costs(run_dir: str, warmup: int) -> dict[str, Any] | None:
    """Median and mean seconds per step of each kind, averaged over ranks, plus per rank, and
    the mean wall time per step over the second half of the measured steps (`wall_late_mean_s`:
    one-time costs, such as the first saves' allocations or the prestarted worker's import,
    fall in the first half of a run long enough for its saves to repeat)."""
    ranks = {r: per_step(ev, warmup) for r, ev in rank_steps(run_dir).items()}
    ranks = {r: d for r, d in ranks.items() if d["wall"]}
    if not ranks:
        return None
    per_rank = {str(r): {f"{name}_median_s": statistics.median(values)
                         for name, values in d.items()} | {"steps": len(d["wall"])}
                for r, d in ranks.items()}
    out: dict[str, Any] = {"per_rank": per_rank}
    for name in FIELDS:
        out[f"{name}_median_s"] = statistics.mean(statistics.median(d[name])
                                                  for d in ranks.values())
        out[f"{name}_mean_s"] = statistics.mean(statistics.mean(d[name]) for d in ranks.values())
    out[LATE] = statistics.mean(statistics.mean(d["wall"][len(d["wall"]) // 2:])
                                for d in ranks.values())
    return out
