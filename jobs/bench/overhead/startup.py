"""Where start-up goes, launch to the first completed step, as consecutive segments on the
critical path: each ends when the last rank got there.

- runtime: starting Ray (ours; `fit()` starts one when none runs);
- launcher: ours: `fit()` to the placement group placed (checks, the supervisor actor, its
  placement); torchrun: its agent and rendezvous until a rank process starts;
- boot: a Ray worker process starting until the actor's `__init__` (torchrun's rank timestamps
  its first statement: its boot is in launcher);
- imports: torch, DTensor, DCP and the rank's modules;
- prewarm: ours' warm-up (one toy FSDP2 step and restore);
- rendezvous + build: the attempt's process group and the model's construction (on the meta
  device, only this rank's shards allocated) and sharding;
- load: the checkpoint load, or on a fresh start agreeing that there is none and filling the
  shards with the seed's initial weights;
- first step.
Ours' times come from `Result.phases` (supervisor and ranks); torchrun's from its event log.
"""

from __future__ import annotations

import json
import os

from harness.events import read_events
from harness.spec import PHASES_FILE

SEGMENTS = ("runtime", "launcher", "boot", "imports", "prewarm", "rendezvous + build", "load",
            "first step")


def _last(values: list[float]) -> float | None:
    return max(values) if values else None


def _ours_marks(run_dir: str, t_launch: float, events: list[dict]) -> list[float | None] | None:
    path = os.path.join(run_dir, PHASES_FILE)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        found = json.load(f)
    phases = [p for p in found["phases"] if p.get("attempt") == 0]

    def end(name: str) -> float | None:
        return _last([p["t_end"] for p in phases if p["phase"] == name])

    imports = [p for p in phases if p["phase"] == "imports"]
    return [t_launch, found["t_fit"], end("placement"),
            _last([p["t_start"] for p in imports]), end("imports"), end("prewarm"),
            _last([e["t"] for e in events if e["ev"] == "pg_ready"]),
            _last([e["t"] for e in events if e["ev"] == "load"]) or end("checkpoint_load")]


def _torchrun_marks(t_launch: float, events: list[dict]) -> list[float | None]:
    first = [e for e in events if e["ev"] == "start"]
    first_pid = {e["rank"]: e["pid"] for e in sorted(first, key=lambda e: e["t"])}
    mine = [e for e in events if e.get("pid", first_pid.get(e.get("rank"))) ==
            first_pid.get(e.get("rank"))]

    def last(ev: str) -> float | None:
        return _last([e["t"] for e in mine if e["ev"] == ev])

    return [t_launch, t_launch, last("start"), None, last("imported"), None, last("pg_ready"),
            last("load")]


def split(run_dir: str, t_launch: float) -> dict[str, float] | None:
    """Seconds per SEGMENTS of the run's start-up (absent segments are 0), or None."""
    events = read_events(run_dir)
    steps = sorted((e for e in events if e["ev"] == "step" and e["rank"] == 0),
                   key=lambda e: e["t"])
    if not steps:
        return None
    before = [e for e in events if e["t"] <= steps[0]["t"]]  # the first attempt's
    marks = _ours_marks(run_dir, t_launch, before)
    if marks is None:
        marks = _torchrun_marks(t_launch, events)
    marks.append(steps[0]["t"])
    out, previous = {}, t_launch
    for name, mark in zip(SEGMENTS, marks[1:], strict=True):
        if mark is None or mark < previous:  # absent, or hidden behind an earlier segment
            out[name] = 0.0
            continue
        out[name], previous = mark - previous, mark
    out["total"] = steps[0]["t"] - t_launch
    return out
