"""The whole benchmark in one command: recovery sweep, checkpoint, fault-free overhead (every
arm of the page) and recovery-tier benchmarks, rendered page.

    python jobs/bench/run_all.py                      # 3 sizes, 3 repetitions -> docs/benchmarks/
    python jobs/bench/run_all.py --quick              # tiny size, 1 repetition (a first look)
    python jobs/bench/run_all.py --sizes tiny,200mb   # a subset of the sizes

Writes the result files into docs/benchmarks/ (or --out) and re-renders docs/benchmarks.md and
the README's summary block from them. Run it on a quiet machine: every number is wall time.
On the 2-core development machine the recovery sweep took 57 min at tiny (200 steps, 54 runs)
and 62 min at 200mb (30 steps, 43 runs) with one fault-free reference per mechanism; the
default of three reference repetitions adds 18 runs per size (~12 min at tiny, ~18 min at
200mb, ~50 min at 1gb). 1gb is estimated at 2.5-3 h with one reference (43 runs of 3-4 min:
12 steps of ~8 s, five recoveries of ~20 s, ~30 s start-up) and the checkpoint benchmark at
~1.5 h; the overhead benchmark with its six arms took 51 min at 1gb and 21 min at 200mb, so
the whole run takes 8-9 hours; --quick about 30 minutes plus the overhead benchmark's tiny
sitting (18 runs of 30-50 s). Nine mechanisms, three
repetitions and a start-up of 7-30 s per run put a floor of ~40 min under each size here. A
size's sweep that must stop goes on later from its journal: `bench_recovery.py --stop-at HH:MM`
and `--resume` (see its docstring).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(BENCH))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sizes", default=None, help="passed to every benchmark")
    p.add_argument("--reps", default=None, help="passed to every benchmark that repeats runs "
                                                "(the tier benchmark runs each plan once)")
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks"))
    args = p.parse_args(argv)
    out = os.path.relpath(os.path.abspath(args.out), ROOT)
    common = ["--quick"] if args.quick else []
    for flag, value in (("--sizes", args.sizes), ("--reps", args.reps)):
        if value:
            common += [flag, value]
    sys.path.insert(0, BENCH)
    from overhead.arms import PAGE_ARMS  # noqa: PLC0415 - jobs/bench is not a package

    once = (["--quick"] if args.quick else []) + (["--sizes", args.sizes] if args.sizes else [])
    steps = [["jobs/bench/bench_recovery.py", *common, "--out", out],
             ["jobs/bench/bench_checkpoint.py", *common, "--out", out],
             ["jobs/bench/bench_overhead.py", *common, "--arms", ",".join(PAGE_ARMS),
              "--out", out],
             ["jobs/bench/bench_tiers.py", *once, "--out", out],
             ["jobs/bench/render.py", "--results", out]]
    for step in steps:
        print("+ python " + " ".join(step), flush=True)
        code = subprocess.call([sys.executable, *step], cwd=ROOT)
        if code != 0:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
