"""Summarizes a before/after check of the recovery benchmark: sittings of one mechanism run from
two checkouts in alternation, their `recovery-<size>.json` files (and timelines beside them)
named `<size>-<label>-<n>.json` in one folder (e.g.
docs/benchmarks/recovery-checks/writer-import-deferred/).

    python jobs/bench/recovery_ab.py docs/benchmarks/recovery-checks/writer-import-deferred
    python jobs/bench/recovery_ab.py docs/benchmarks/recovery-checks/node-writers-early \
        --scenario node_loss

Prints, per size and label, the medians over every run of the scenario (AWS by default): time
to the last step, start-up, the rest of the wall, recovery per fault kind (every recovery
pooled), each recovery phase the timelines hold (teardown, rendezvous, checkpoint_load, and
first_step: from the restore to the next completed step), pooled and per fault kind, the
wait from a respawned rank's readiness to the new attempt's launch where the runs' own phases
files are beside them (`<size>-<label>-<n>.phases/<run>.json`, each run folder's
`phases.json`), and whether every run ended bit-equal to its own fault-free run.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import statistics
import sys
from collections import defaultdict


def runs_by_label(folder: str, mechanism: str,
                  scenario: str = "aws") -> dict[tuple[str, str], list[dict]]:
    """Per (size, label), the successful runs of `mechanism` in `scenario`; each run carries
    its timeline under "timeline" where the sitting's timelines file is beside it."""
    found: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for path in sorted(glob.glob(os.path.join(folder, "*-*-*.json"))):
        size, label, _ = os.path.basename(path)[:-len(".json")].rsplit("-", 2)
        with open(path, encoding="utf-8") as f:
            result = json.load(f)
        timelines = _timelines(path[:-len(".json")] + ".timelines.json.gz")
        for run in result["scenarios"].get(scenario, {}).get("runs", []):
            if run["mechanism"] == mechanism and run["status"] == "ok":
                key = f"{run['mechanism']}-{scenario}-rep{run['rep']}"
                named = [name for name in timelines if name.endswith(key)]
                found[(size, label)].append({
                    **run, "timeline": timelines[named[0]] if named else None,
                    "phases": _phases(path[:-len(".json")] + ".phases", named)})
    return found


def _phases(folder: str, named: list[str]) -> list[dict] | None:
    """The run's own phases file (`phases.json` of its run folder, copied as `<run>.json`)."""
    path = os.path.join(folder, f"{named[0]}.json") if named else ""
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)["phases"]


def launch_waits(runs: list[dict]) -> list[float]:
    """Per recovery that started a rank anew: from the last respawned rank's prewarm end (ready
    to train) to the first rank's release of the new attempt's groups (the attempt launched);
    negative where the attempt launched first and waited for the prewarm."""
    waits = []
    for run in runs:
        by_attempt: dict[int, list[dict]] = defaultdict(list)
        for phase in run.get("phases") or []:
            by_attempt[phase.get("attempt") or 0].append(phase)
        for attempt, phases in sorted(by_attempt.items()):
            ready = [p["t_end"] for p in phases if p["phase"] == "prewarm"]
            launched = [p["t_start"] for p in phases if p["phase"] == "release_groups"]
            if attempt and ready and launched:
                waits.append(min(launched) - max(ready))
    return waits


def _timelines(path: str) -> dict[str, dict]:
    if not os.path.exists(path):
        return {}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def phase_seconds(runs: list[dict], kind: str | None = None) -> dict[str, list[float]]:
    """Every recovery's phase durations (seconds) by phase name, over `runs`' timelines (only
    the faults of `kind` where given), and "first_step": from the end of its last phase (the
    restore) to the next completed step."""
    found: dict[str, list[float]] = defaultdict(list)
    for run in runs:
        for fault in (run.get("timeline") or {}).get("faults", []):
            if kind is not None and fault.get("kind") != kind:
                continue
            phases = fault.get("phases", [])
            for phase in phases:
                found[phase["phase"]].append(phase["t_end"] - phase["t_start"])
            if phases and fault.get("t_first_step") is not None:
                found["first_step"].append(
                    fault["t_first_step"] - max(p["t_end"] for p in phases))
    return found


def summary(runs: list[dict]) -> dict[str, float | int | bool]:
    scores = [r["score"] for r in runs]

    def median(values: list[float]) -> float:
        return round(statistics.median(values), 2) if values else float("nan")

    kinds = sorted({kind for s in scores for kind in s["recovery_s"]})
    out: dict[str, float | int | bool] = {
        "runs": len(runs), "wall_s": median([s["wall_s"] for s in scores]),
        "startup_s": median([s["startup_s"] for s in scores]),
        "after_startup_s": median([s["wall_s"] - s["startup_s"] for s in scores]),
    }
    for kind in kinds:
        out[f"{kind}_p50_s"] = median([x for s in scores for x in s["recovery_s"].get(kind, [])])
    for phase, seconds in sorted(phase_seconds(runs).items()):
        out[f"{phase}_p50_s"] = median(seconds)
    if len(kinds) > 1:  # each kind's phases too: a SIGKILL's restart is not an exception's
        for kind in kinds:
            for phase, seconds in sorted(phase_seconds(runs, kind).items()):
                out[f"{kind}_{phase}_p50_s"] = median(seconds)
    if any(r.get("phases") for r in runs):
        out["launch_wait_p50_s"] = median(launch_waits(runs))
    out["bit_equal"] = all(r["params_equal_own"] for r in runs)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder")
    p.add_argument("--mechanism", default="ours")
    p.add_argument("--scenario", default="aws", help="aws, hang or node_loss")
    args = p.parse_args(argv)
    found = runs_by_label(args.folder, args.mechanism, args.scenario)
    for (size, label), runs in sorted(found.items()):
        print(size, label, json.dumps(summary(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
