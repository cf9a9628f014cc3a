"""One run of the sweep: start it isolated, score it, compare its parameters, keep a record."""

from __future__ import annotations

import os
import shutil
from typing import Any

from harness.spec import Workload
from harness.workload import params_equal, read_final_params
from scoring.yardstick import score_run

from ray_resilience.goodput import RunTimeline

from .isolated import run_isolated

#: Subfolders of a run that hold checkpoints: deleted after the run (they can be gigabytes).
BULKY = ("checkpoints", "storage")


def execute(mechanism: str, workload: Workload, *, phase: str, rep: int,
            timeout_s: float) -> dict[str, Any]:
    """Run it; the record keeps the timeline (as a dict) until `score`."""
    result = run_isolated(mechanism, workload, timeout_s=timeout_s)
    for name in BULKY:
        shutil.rmtree(os.path.join(workload.run_dir, name), ignore_errors=True)
    return {"mechanism": mechanism, "phase": phase, "rep": rep, "status": result["status"],
            "error": result.get("error"), "notes": result.get("notes", []),
            "intervals": {"durable": workload.checkpoint_interval,
                          "local": workload.local_interval},
            "faults_planned": len(workload.fault_plan), "usage": result.get("usage"),
            "run_dir": workload.run_dir, "timeline": result.get("timeline")}


def timeline_of(record: dict[str, Any]) -> RunTimeline | None:
    return RunTimeline.from_dict(record["timeline"]) if record.get("timeline") else None


def score(record: dict[str, Any], yardstick_s: float | None, num_spares: int) -> None:
    """Adds the shared-yardstick score (ok runs only) and the number of faults that fired."""
    timeline = timeline_of(record)
    record["faults_fired"] = len(timeline.faults) if timeline is not None else None
    ok = record["status"] == "ok" and timeline is not None
    record["score"] = score_run(timeline, yardstick_s, num_spares=num_spares).to_dict() if ok \
        else None


def compare(record: dict[str, Any], *, own: str | None, family: str | None) -> None:
    """Bit-equality of the run's final parameters with its mechanism's fault-free run (`own`)
    and with its family's reference fault-free run (`family`): run folders, None if absent."""
    mine = read_final_params(record["run_dir"]) if record["status"] == "ok" else None
    for key, folder in (("own", own), ("family", family)):
        other = read_final_params(folder) if folder else None
        if mine is None or other is None:
            record[f"params_equal_{key}"] = None
            continue
        equal, diff = params_equal(mine, other)
        record[f"params_equal_{key}"] = equal
        record[f"params_max_abs_diff_{key}"] = diff
