"""The whole benchmark in one command: recovery sweep, checkpoint benchmark, rendered page.

    python jobs/bench/run_all.py                      # 3 sizes, 3 repetitions -> docs/benchmarks/
    python jobs/bench/run_all.py --quick              # tiny size, 1 repetition (a first look)
    python jobs/bench/run_all.py --sizes tiny,200mb   # a subset of the sizes

Writes the result files into docs/benchmarks/ (or --out) and re-renders docs/benchmarks.md and
the README's summary block from them. Run it on a quiet machine: every number is wall time.
On the 2-core development machine the full run takes about 6-7 hours (recovery: tiny ~1 h,
200mb ~1.5 h, 1gb ~3 h; checkpoint benchmark ~1.5 h); --quick about 35 minutes.
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
    p.add_argument("--sizes", default=None, help="passed to both benchmarks")
    p.add_argument("--reps", default=None, help="passed to both benchmarks")
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks"))
    args = p.parse_args(argv)
    out = os.path.relpath(os.path.abspath(args.out), ROOT)
    common = ["--quick"] if args.quick else []
    for flag, value in (("--sizes", args.sizes), ("--reps", args.reps)):
        if value:
            common += [flag, value]
    steps = [["jobs/bench/bench_recovery.py", *common, "--out", out],
             ["jobs/bench/bench_checkpoint.py", *common, "--out", out],
             ["jobs/bench/render.py", "--results", out]]
    for step in steps:
        print("+ python " + " ".join(step), flush=True)
        code = subprocess.call([sys.executable, *step], cwd=ROOT)
        if code != 0:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
