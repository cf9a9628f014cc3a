"""Fault-free overhead benchmark: ours against plain torchrun running the same loop.

    python jobs/bench/bench_overhead.py --quick                       # tiny, 3 repetitions
    python jobs/bench/bench_overhead.py --sizes tiny,200mb,1gb --reps 5 --out docs/benchmarks
    python jobs/bench/bench_overhead.py --arms ours,ours@before --checkout before=/tmp/base

Arms (`overhead/arms.py`): torchrun, ours-disabled, ours by default; ours-nockpt, ours-nolocal
and torchrun-dcp split the cost into its parts. Each optionally runs from another checkout
(`NAME@LABEL` with `--checkout LABEL=PATH`) for before/after comparisons. Repetitions interleave
the arms (`overhead/ab.py`); every run reports per-step wall time, training-thread CPU and rank
process CPU (`overhead/steps.py`) with the load average. Writes `overhead.json` into --out; a
rerun of some sizes into a folder that holds results replaces only those sizes (each size keeps
the date, command and repetitions of the sitting that measured it). `render.py` adds its table
to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [BENCH, os.path.dirname(os.path.dirname(BENCH))]

from overhead.ab import run_size  # noqa: E402 - after the path set-up above
from overhead.arms import PAGE_ARMS, SETTINGS, parse_arms  # noqa: E402
from sweep import machine  # noqa: E402
from sweep.journal import checkout_commit  # noqa: E402
from sweep.results import read_json, write_json  # noqa: E402

DEFAULT_ARMS = "torchrun,ours-disabled,ours"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny size, 3 repetitions")
    p.add_argument("--sizes", default=None, help=f"comma-separated from {', '.join(SETTINGS)}")
    p.add_argument("--arms", default=DEFAULT_ARMS, help="comma-separated mechanism[@label]")
    p.add_argument("--checkout", action="append", default=[], metavar="LABEL=PATH",
                   help="another checkout whose code arms named NAME@LABEL run")
    p.add_argument("--reps", type=int, default=None, help="repetitions (default 5; --quick 3)")
    p.add_argument("--out", default=None, help="result folder (default results/bench/<time>)")
    p.add_argument("--work", default=None, help="scratch folder (default /tmp/rrbench-oh-<time>)")
    p.add_argument("--run-timeout-s", type=float, default=900.0)
    args = p.parse_args(argv)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.sizes = [s for s in (args.sizes or ("tiny" if args.quick else ",".join(SETTINGS)))
                  .split(",") if s]
    unknown = [s for s in args.sizes if s not in SETTINGS]
    if unknown:
        p.error(f"--sizes: unknown {unknown}; choose from {', '.join(SETTINGS)}")
    checkouts = dict(c.split("=", 1) for c in args.checkout if "=" in c)
    try:
        args.arms = parse_arms([a for a in args.arms.split(",") if a], checkouts)
    except ValueError as exc:
        p.error(str(exc))
    args.reps = args.reps or (3 if args.quick else 5)
    if args.reps < 1:
        p.error(f"--reps={args.reps} must be >= 1")
    args.out = os.path.abspath(args.out or os.path.join("results", "bench", stamp))
    args.work = os.path.abspath(args.work or f"/tmp/rrbench-oh-{stamp}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python jobs/bench/bench_overhead.py " + shlex.join(sys.argv[1:] if argv is None
                                                                   else argv)
    code = {"this": checkout_commit()}
    code.update({arm.name.partition("@")[2]: checkout_commit(arm.checkout)
                 for arm in args.arms if arm.checkout})
    document = {"benchmark": "overhead", **machine.describe(command), "reps": args.reps,
                "arms": [a.name for a in args.arms], "code": code, "sizes": {}}
    started = time.time()
    for name in args.sizes:
        print(f"{name}:", flush=True)
        entry = run_size(name, args.arms, reps=args.reps, work_dir=args.work,
                         timeout_s=args.run_timeout_s, log=lambda line: print(line, flush=True))
        document["sizes"][name] = {**entry, "sitting": sitting(document)}
    document["duration_s"] = round(time.time() - started, 1)
    document["machine"]["load_average_at_end"] = round(os.getloadavg()[0], 2)
    path = os.path.join(args.out, "overhead.json")
    print(f"wrote {write_json(path, merged(path, document))}")
    return 0


SITTING = ("date_utc", "command", "reps", "arms", "code")
"""What each size entry records (under "sitting") of the invocation that measured it ("code":
the commit of this checkout and of each `--checkout` label; older sittings lack it)."""


def sitting(document: dict) -> dict:
    return {key: document[key] for key in SITTING if key in document}


def merged(path: str, document: dict) -> dict:
    """`document` over the results already at `path`: its sizes replace theirs, the others stay
    (each with its own sitting); the top level is the newest sitting's, its arms every size's."""
    if not os.path.exists(path):
        return document
    old = read_json(path)
    sizes = {name: {"sitting": sitting(old), **entry}
             for name, entry in old.get("sizes", {}).items()}
    sizes.update(document["sizes"])
    arms = list(document["arms"])
    for entry in sizes.values():
        arms += [arm for arm in entry["arms"] if arm not in arms]
    arms.sort(key=lambda arm: PAGE_ARMS.index(arm) if arm in PAGE_ARMS else len(PAGE_ARMS))
    return {**document, "arms": arms, "sizes": sizes}


if __name__ == "__main__":
    sys.exit(main())
