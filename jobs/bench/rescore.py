"""Re-scores committed recovery results from their own timelines with the current scoring code,
so a change of a definition reaches the page without re-running a sweep of hours.

    python jobs/bench/rescore.py docs/benchmarks/recovery-*.json           # rewrite in place
    python jobs/bench/rescore.py --check docs/benchmarks/recovery-*.json   # exit 1 if stale

Each scenario run's score is recomputed by `scoring.yardstick.score_run` from its timeline in
`recovery-<size>.timelines.json.gz` (written by the sweep beside the result), with the
document's yardstick and the mechanism's charged spares, and each scenario's per-mechanism
summaries are rebuilt from the runs. Nothing measured changes: the timelines are the raw record.
A document whose scores moved gets an entry under "rescored" (UTC date, the fields that moved,
why) that the page prints beside the sweep's own provenance; the commit that changed the file
holds the scoring code that did it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from typing import Any

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
sys.path.insert(1, os.path.dirname(os.path.dirname(BENCH)))

from scoring.yardstick import score_run  # noqa: E402 - after the path set-up
from sweep.results import read_json, write_json  # noqa: E402
from sweep.summary import summarize_faulty  # noqa: E402

from ray_resilience.goodput import RunTimeline  # noqa: E402


def timelines_path(result_path: str) -> str:
    return result_path.removesuffix(".json") + ".timelines.json.gz"


def run_key(timelines: dict[str, Any], row: dict[str, Any]) -> str:
    """The timeline of a result row: keys are "<index>-<mechanism>-<phase>-rep<rep>"."""
    wanted = f"{row['mechanism']}-{row['phase']}-rep{row['rep']}"
    keys = [k for k in timelines if k.split("-", 1)[1] == wanted]
    if len(keys) != 1:
        raise ValueError(f"{len(keys)} timelines match the run {wanted!r}; expected exactly one. "
                         "Is the timelines file the one the sweep wrote beside this result?")
    return keys[0]


def rescore(doc: dict[str, Any], timelines: dict[str, Any]) -> list[str]:
    """Re-scores `doc` in place; returns what moved ("<scenario>/<mechanism> rep<n>: field a ->
    b", one line per changed field of a run)."""
    stick = (doc.get("yardstick") or {}).get("step_s")
    moved: list[str] = []
    for scenario_name, scenario in doc["scenarios"].items():
        for row in scenario["runs"]:
            if row["status"] != "ok" or row.get("score") is None:
                continue
            timeline = RunTimeline.from_dict(timelines[run_key(timelines, row)])
            spares = doc["mechanisms"][row["mechanism"]]["num_spares"]
            new = score_run(timeline, stick, num_spares=spares).to_dict()
            for field, value in new.items():
                if row["score"].get(field) != value:
                    moved.append(f"{scenario_name}/{row['mechanism']} rep{row['rep']}: {field} "
                                 f"{row['score'].get(field)!r} -> {value!r}")
            row["score"] = new
        mechanisms = dict.fromkeys(r["mechanism"] for r in scenario["runs"])
        scenario["summary"] = {m: summarize_faulty([r for r in scenario["runs"]
                                                     if r["mechanism"] == m])
                               for m in mechanisms}
    return moved


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", help="recovery-<size>.json files")
    p.add_argument("--check", action="store_true", help="report, write nothing; exit 1 if stale")
    p.add_argument("--note", default="", help="why the scores moved (kept in the document)")
    args = p.parse_args(argv)
    stale = False
    for path in args.results:
        doc, timelines = read_json(path), read_json(timelines_path(path))
        before = _canonical(doc["scenarios"])
        moved = rescore(doc, timelines)
        changed = _canonical(doc["scenarios"]) != before
        print(f"{path}: {len(moved)} score field(s) moved" + ("" if changed else ", unchanged"))
        for line in moved:
            print(f"  {line}")
        if not changed:
            continue
        stale = True
        if args.check:
            continue
        doc.setdefault("rescored", []).append({
            "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
            "note": args.note,
            "fields": sorted({line.split(": ", 1)[1].split(" ", 1)[0] for line in moved})})
        write_json(path, doc)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
