"""How long a fresh process takes to import what a rank imports, by glibc allocator setting.

The A/B of glibc keeping freed memory (docs/design.md, section 8) found `fit()` to the first step
~1.2 s longer with the settings. This probe checks one suspect without Ray: a new Python process
importing torch, transformers, DCP, FSDP, DTensor and our rank worker module, with glibc as it
comes, with all of `rebuild_probe.KEEP_ENV`, and with each of its settings alone. The variants
alternate within each repetition; every run is a fresh process with the inherited MALLOC_*
variables removed first.

    python jobs/bench/overhead/import_probe.py --reps 5 --out imports.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

from rebuild_probe import KEEP_ENV

CODE = ("import torch, transformers, torch.distributed.checkpoint, torch.distributed.fsdp, "
        "torch.distributed.tensor; import ray_resilience._internal.rank.worker")
VARIANTS = {"default": {}, "keep": KEEP_ENV, **{k: {k: v} for k, v in KEEP_ENV.items()}}


def _import_wall_s(env: dict[str, str]) -> float:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", CODE], env={**base, **env}, check=True)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", required=True, help="result JSON file")
    args = p.parse_args(argv)
    started = datetime.datetime.now(datetime.UTC)
    walls: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.reps):
        for name, env in VARIANTS.items():
            walls[name].append(_import_wall_s(env))
    variants = {name: {"env": VARIANTS[name], "wall_s": ws, "median_s": statistics.median(ws),
                       "min_s": min(ws), "max_s": max(ws)} for name, ws in walls.items()}
    doc = {"command": "python jobs/bench/overhead/import_probe.py "
                      + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
           "date_utc": started.strftime("%Y-%m-%d %H:%M UTC"), "reps": args.reps,
           "code": CODE, "variants": variants}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    for name, v in variants.items():
        print(f"{name:24s} median {v['median_s']:.2f} s  (min {v['min_s']:.2f}, "
              f"max {v['max_s']:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
