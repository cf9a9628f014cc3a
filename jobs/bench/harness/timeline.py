"""Turn a peer's event log and fault ledger into a `RunTimeline`, the same record our supervisor
keeps, so `compute_goodput` applies one definition to every mechanism.

Which events stand for what (all times `time.time()`):
- a completed step is rank 0's `step` event. Every step ends in FSDP's reduce-scatter, so rank 0
  finishing step s means every rank got through step s's collectives; rank 0 is also never the
  target of the AWS generator's faults, so its log has no gap of its own making.
- a save is rank 0's `save` (sync saves end in a collective, so its blocking is every rank's);
  a commit is the `commit` event (rank 0's marker, or Ray Train's controller registering it).
- per fault, within the window from its `t_fault` to the next fault's:
  detect = first `detect` event (a launcher's failure log line, Ray Train's `after_exception`);
  teardown = detect to the first new `start`; rendezvous = that start to the last rank's
  `pg_ready`; checkpoint_load = rank 0's `load`; the first completed step after the fault ends
  the recovery. A mechanism that shows no detection signal gets no detect phase: its detect time
  is taken as the first new start, and a note says so instead of inventing a split. When rank 0
  loads nothing (torchft: it keeps training), it resumed from the step before its next one.
- a fault fires at the start of its step s, so s - 1 steps were complete: steps redone are
  the step reached (s - 1, or the last step rank 0 completed before the recovered run's first
  step where the ranks stepped on, as a simulated node's do until its processes are gone)
  minus the step resumed from, for every mechanism (`compute_goodput`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ray_resilience.goodput import RunTimeline
from ray_resilience.testing import FaultKind

from .events import FaultLedger, read_events

Event = dict[str, Any]
LEAD_RANK = 0


def build_timeline(
    run_dir: str, *, world_size: int, t_start: float
) -> tuple[RunTimeline, list[str]]:
    """Timeline of the run in `run_dir` (events + ledger), and notes on how it was observed."""
    return events_to_timeline(
        read_events(run_dir), FaultLedger(run_dir).records(), world_size=world_size,
        t_start=t_start)


def events_to_timeline(
    events: Sequence[Event], fired: Sequence[Event], *, world_size: int, t_start: float
) -> tuple[RunTimeline, list[str]]:
    """Pure conversion (unit-tested on synthetic logs); see the module docstring."""
    events = sorted(events, key=lambda e: e["t"])
    notes: list[str] = []
    timeline = RunTimeline()
    timeline.run_started(t_start, world_size)
    lead = [e for e in events if e.get("rank") == LEAD_RANK]
    steps = _of(lead, "step")
    for e in steps:  # "world": participating ranks, where a mechanism can train with fewer
        timeline.step_completed(e["step"], e["t"], e.get("world", world_size))
    for e in _of(lead, "save"):
        timeline.checkpoint_saved(e["step"], e["t"], e["blocking_s"],
                                  tier=e.get("tier") or "storage")
    for e in _of(events, "commit"):
        timeline.checkpoint_committed(e["step"], e["t"])
    ordered = sorted(fired, key=lambda f: f["t_fault"])
    for index, fault in enumerate(ordered):
        t_next = ordered[index + 1]["t_fault"] if index + 1 < len(ordered) else math.inf
        window = [e for e in events if fault["t_fault"] < e["t"] < t_next]
        _record_fault(timeline, fault, window, steps, notes)
    done = _of(lead, "done")
    t_end = max((e["t"] for e in done), default=events[-1]["t"] if events else t_start)
    final_step = max((e["step"] for e in steps), default=0)
    timeline.run_finished(max(t_end, t_start), final_step)
    return timeline, notes


def _of(events: Sequence[Event], kind: str) -> list[Event]:
    return [e for e in events if e["ev"] == kind]


def _record_fault(
    timeline: RunTimeline, fault: Event, window: list[Event], steps: list[Event],
    notes: list[str],
) -> None:
    fid, t_fault = fault["id"], fault["t_fault"]
    detects, starts = _of(window, "detect"), _of(window, "start")
    t_new = min((e["t"] for e in starts), default=None)
    candidates = [t for t in (detects[0]["t"] if detects else None, t_new) if t is not None]
    if not detects:
        notes.append(f"{fid}: no detection signal observed; detect time "
                     + ("= first new process start (includes teardown)" if t_new is not None
                        else "unknown (training never resumed)"))
    t_detect = max(t_fault, min(candidates, default=t_fault))
    kind = FaultKind(fault["kind"])
    timeline.fault_detected(
        fid, t_fault=t_fault, t_detect=t_detect, step_at_fault=fault["step"] - 1,
        rank=fault["rank"], cause=kind.recorded_cause, kind=kind.value)
    if detects:
        timeline.recovery_phase(fid, "detect", t_fault, t_detect)
    if t_new is not None and t_new > t_detect:
        timeline.recovery_phase(fid, "teardown", t_detect, t_new)
    t_pg = _rendezvous_end(window, t_new)
    if t_new is not None and t_pg is not None and t_pg >= t_new:
        timeline.recovery_phase(fid, "rendezvous", t_new, t_pg)
    load = next((e for e in _of(window, "load") if e.get("rank") == LEAD_RANK), None)
    if load is None:  # rank 0 kept training (torchft): its next step ends the stall
        first = next((e for e in steps if e["t"] > t_fault), None)
        if first is not None:
            timeline.recovery_done(fid, first["t"], first["step"] - 1)
        return
    if load["t"] >= load["t_start"]:
        # A torchft replica heals from a live peer's memory ("peer").
        tier = {"local": "local", "peer": "memory"}.get(load.get("tier"), "storage") \
            if load["from_step"] > 0 else None
        timeline.recovery_phase(fid, "checkpoint_load", load["t_start"], load["t"], tier=tier)
    first = next((e for e in steps if e["t"] > load["t"]), None)
    if first is not None:
        timeline.recovery_done(fid, first["t"], load["from_step"])


def _rendezvous_end(window: list[Event], t_new: float | None) -> float | None:
    """The last rank's first `pg_ready` after the new attempt started (all ranks joined)."""
    if t_new is None:
        return None
    first_per_rank: dict[int, float] = {}
    for e in _of(window, "pg_ready"):
        if e["t"] >= t_new:
            first_per_rank.setdefault(e["rank"], e["t"])
    return max(first_per_rank.values(), default=None)


def align_to_ledger(timeline: RunTimeline, fired: Sequence[Event]) -> tuple[RunTimeline, list[str]]:
    """A supervisor-recorded timeline with its faults re-labelled from the benchmark's ledger.

    Ours detects faults itself and records them at detection; the ledger knows when each fired
    (before its step's forward pass) and which it was. Each fired fault is matched to the first
    unmatched detection at or after it; it takes the ledger's id, kind, time and step (s - 1
    steps were complete), keeping the recorded detection and recovery phases.
    """
    data = timeline.to_dict()
    detected = sorted(data["faults"], key=lambda f: f["t_detect"])
    notes, used = [], set()
    for fault in sorted(fired, key=lambda f: f["t_fault"]):
        match = next((i for i, d in enumerate(detected)
                      if i not in used and d["t_detect"] >= fault["t_fault"]), None)
        if match is None:
            notes.append(f"{fault['id']}: fired but never detected")
            continue
        used.add(match)
        kind = FaultKind(fault["kind"])
        detected[match].update(fault_id=fault["id"], kind=kind.value, cause=kind.recorded_cause,
                               t_fault=fault["t_fault"], step_at_fault=fault["step"] - 1,
                               rank=fault["rank"])
    notes += [f"unplanned fault detected ({d['cause']}, {d['fault_id']})"
              for i, d in enumerate(detected) if i not in used]
    data["faults"] = detected
    return RunTimeline.from_dict(data), notes
