"""Summarizes a before/after check of the recovery benchmark: sittings of one mechanism run from
two checkouts in alternation, their `recovery-<size>.json` files named `<size>-<label>-<n>.json`
in one folder (e.g. docs/benchmarks/recovery-checks/writer-import-deferred/).

    python jobs/bench/recovery_ab.py docs/benchmarks/recovery-checks/writer-import-deferred

Prints, per size and label, the medians over every AWS-schedule run: time to the last step,
start-up, the rest of the wall, SIGKILL and exception recovery (every recovery pooled), and
whether every run ended bit-equal to its own fault-free run.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
from collections import defaultdict


def runs_by_label(folder: str, mechanism: str) -> dict[tuple[str, str], list[dict]]:
    found: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for path in sorted(glob.glob(os.path.join(folder, "*-*-*.json"))):
        size, label, _ = os.path.basename(path)[:-len(".json")].rsplit("-", 2)
        with open(path, encoding="utf-8") as f:
            result = json.load(f)
        for run in result["scenarios"]["aws"]["runs"]:
            if run["mechanism"] == mechanism and run["status"] == "ok":
                found[(size, label)].append(run)
    return found


def summary(runs: list[dict]) -> dict[str, float | int | bool]:
    scores = [r["score"] for r in runs]

    def median(values: list[float]) -> float:
        return round(statistics.median(values), 2) if values else float("nan")

    return {
        "runs": len(runs), "wall_s": median([s["wall_s"] for s in scores]),
        "startup_s": median([s["startup_s"] for s in scores]),
        "after_startup_s": median([s["wall_s"] - s["startup_s"] for s in scores]),
        "sigkill_p50_s": median([x for s in scores for x in s["recovery_s"].get("sigkill", [])]),
        "exception_p50_s": median([x for s in scores
                                   for x in s["recovery_s"].get("exception", [])]),
        "bit_equal": all(r["params_equal_own"] for r in runs),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder")
    p.add_argument("--mechanism", default="ours")
    args = p.parse_args(argv)
    for (size, label), runs in sorted(runs_by_label(args.folder, args.mechanism).items()):
        print(size, label, json.dumps(summary(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
