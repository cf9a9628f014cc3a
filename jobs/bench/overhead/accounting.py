"""Where a run's CPU and memory go in steady state: every process the run started (by role) and
every thread of each rank process (by name), between two steps after the warm-up.

Processes come from the runner's samples (`harness.resources.Meter`, every 0.2 s); a rank's
threads from its own snapshots at `Workload.snapshot_steps` (`harness.threads`). CPU is given per
training step and as a share of one core over the window; memory is the largest resident set a
process had in the window (summed over the processes of a role).
"""

from __future__ import annotations

import bisect
import json
import os
import re
from typing import Any

from harness.events import read_events
from sweep.runner import PROCESSES_FILE

#: Rank and attempt suffixes of our thread names ("rr-progress-r0-a2" -> "rr-progress").
_SUFFIX = re.compile(r"(-r\d+)?(-a\d+)?$")


def _at(samples: list[list[float]], t: float) -> list[float] | None:
    """The last sample at or before `t` (None when the process had none yet)."""
    i = bisect.bisect_right([s[0] for s in samples], t)
    return samples[i - 1] if i else None


def _window(events: list[dict[str, Any]]) -> tuple[float, float, int, int] | None:
    """(t, t, step, step) of rank 0's first and last thread snapshots."""
    snaps = [e for e in events if e["ev"] == "threads" and e["rank"] == 0]
    if len(snaps) < 2:
        return None
    return snaps[0]["t"], snaps[-1]["t"], snaps[0]["step"], snaps[-1]["step"]


def processes(run_dir: str, t0: float, t1: float, steps: int) -> dict[str, dict[str, Any]]:
    """Per role: processes alive in the window, CPU per step, share of a core, peak RSS."""
    path = os.path.join(run_dir, PROCESSES_FILE)
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        found = json.load(f)
    out: dict[str, dict[str, Any]] = {}
    for entry in found.values():
        samples = entry["samples"]
        inside = [s for s in samples if t0 <= s[0] <= t1]
        if not inside:
            continue
        start = _at(samples, t0)  # None: it started inside the window, all its CPU counts
        cpu = inside[-1][1] - (start[1] if start else 0.0)
        role = out.setdefault(entry["role"], {"count": 0, "cpu_s": 0.0, "rss_bytes": 0})
        role["count"] += 1
        role["cpu_s"] += cpu
        role["rss_bytes"] += max(s[2] for s in inside)
    for role in out.values():
        role["cpu_per_step_s"] = role["cpu_s"] / steps
        role["core_share"] = role["cpu_s"] / (t1 - t0)
    return out


def rank_threads(events: list[dict[str, Any]], steps: int) -> dict[str, dict[str, Any]]:
    """Per thread name, summed over ranks: CPU per step, context switches per step, nice."""
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for e in events:
        if e["ev"] == "threads":
            by_rank.setdefault(e["rank"], []).append(e)
    out: dict[str, dict[str, Any]] = {}
    for snaps in by_rank.values():
        if len(snaps) < 2:
            continue
        before = {t["tid"]: t for t in snaps[0]["threads"]}
        for t in snaps[-1]["threads"]:
            old = before.get(t["tid"], {"cpu_s": 0.0, "voluntary": 0, "involuntary": 0})
            name = _SUFFIX.sub("", t["name"]) if t["python"] else t["name"]
            row = out.setdefault(name, {"count": 0, "cpu_s": 0.0, "switches": 0, "nice": set()})
            row["count"] += 1
            row["cpu_s"] += t["cpu_s"] - old["cpu_s"]
            row["switches"] += (t["voluntary"] - old["voluntary"]
                                + t["involuntary"] - old["involuntary"])
            row["nice"].add(t["nice"])
    return {name: {"count": r["count"], "cpu_per_step_s": r["cpu_s"] / steps,
                   "switches_per_step": r["switches"] / steps, "nice": sorted(r["nice"])}
            for name, r in sorted(out.items(), key=lambda kv: -kv[1]["cpu_s"])}


def account(run_dir: str) -> dict[str, Any] | None:
    """The run's steady-state accounting, None without two thread snapshots."""
    events = read_events(run_dir)
    window = _window(events)
    if window is None:
        return None
    t0, t1, s0, s1 = window
    steps = s1 - s0
    return {"steps": steps, "window_s": t1 - t0,
            "processes": processes(run_dir, t0, t1, steps),
            "rank_threads": rank_threads(events, steps)}
