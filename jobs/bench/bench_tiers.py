"""Recovery-tier benchmark: what the local tier costs a fault-free step, the interval it picks,
and how fast each tier restores, at every state size.

    python jobs/bench/bench_tiers.py --quick                 # tiny size only
    python jobs/bench/bench_tiers.py --out docs/benchmarks   # tiny, 200mb, 1gb -> tiers.json
    python jobs/bench/bench_tiers.py --sizes 1gb --plans memory --out docs/benchmarks  # one rerun
    python jobs/bench/render.py                              # the page's "Recovery tiers" part

Per size (`harness/sizes.py`), FSDP2 LLaMA on 2 gloo ranks through `ResilientTrainer` with
`ResilienceConfig.default()` (`tiers/runs.py`): the local tier off (the per-step baseline), on
("auto", an exception on rank 1 near the end: recovery, steps redone, local restore), and with it
off an exception restored from writer memory, then with the memory tier off from storage. One
run at a time, each on its own private Ray.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [BENCH, os.path.dirname(os.path.dirname(BENCH))]

import ray  # noqa: E402 - after the path set-up above
from harness.sizes import SIZES  # noqa: E402
from sweep import machine  # noqa: E402
from sweep.results import read_json, write_json  # noqa: E402
from tiers import runs  # noqa: E402

from ray_resilience.examples.token_data import generate_shards  # noqa: E402

ATTEMPTS = 3
os.environ.setdefault("RAY_raylet_start_wait_time_s", "300")  # a loaded machine starts slowly

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny size only")
    p.add_argument("--sizes", default=None, help=f"comma-separated from {', '.join(SIZES)}")
    p.add_argument("--plans", default="off,auto,memory,storage")
    p.add_argument("--out", default=None, help="result folder (default results/bench/<time>)")
    args = p.parse_args(argv)
    sizes = args.sizes or ("tiny" if args.quick else ",".join(SIZES))
    args.sizes = [s for s in sizes.split(",") if s]
    unknown = [s for s in args.sizes if s not in SIZES]
    if unknown:
        p.error(f"--sizes: unknown {unknown}; choose from {', '.join(SIZES)}")
    args.plans = [s for s in args.plans.split(",") if s]
    args.out = os.path.abspath(args.out or os.path.join("results", "bench",
                                                        time.strftime("%Y%m%d-%H%M%S")))
    return args


def _run(shape: object, plan: runs.Plan, steps: int, data_dir: str, work: str) -> dict:
    """One run; a private Ray that fails to start (an overloaded machine) is tried again."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            result = runs.run(shape, plan, steps=steps, data_dir=data_dir,
                              out_dir=os.path.join(work, "runs"))
            return {**result, "start_attempts": attempt}
        except Exception as exc:  # noqa: BLE001 - Ray's start-up timeout is a plain Exception
            print(f"[tiers] {plan.name}: attempt {attempt} failed: {exc}", flush=True)
            error = f"{type(exc).__name__}: {exc}"
            ray.shutdown()  # whatever of the failed start is left
    return {"ok": False, "error": error, "plan": plan.name}


def merged(out: str, doc: dict) -> dict:
    """`doc` over the results already in `out`: a rerun of some sizes or plans replaces only
    those runs (partial results survive a failure too)."""
    path = os.path.join(out, "tiers.json")
    if not os.path.exists(path):
        return doc
    old = read_json(path)
    sizes = {e["size"]: e for e in old.get("sizes", [])}
    for entry in doc["sizes"]:
        kept = sizes.get(entry["size"])
        if kept is not None:
            entry = {**kept, **entry, "runs": {**kept["runs"], **entry["runs"]}}
        sizes[entry["size"]] = entry
    order = [n for n in SIZES if n in sizes]
    return {**old, **doc, "sizes": [sizes[n] for n in order]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    doc = {**machine.describe(shlex.join([sys.executable, *sys.argv])),
           "checksum_gb_s": runs.checksum_rates(), "sizes": []}
    with tempfile.TemporaryDirectory(prefix="rr-tiers-") as work:
        data_dir = os.path.join(work, "data")
        generate_shards(data_dir)
        for name in args.sizes:
            shape, steps = SIZES[name], runs.STEPS[name]
            entry = {"size": name, "state_bytes_per_rank": shape.state_bytes_per_rank,
                     "steps": steps, "runs": {}}
            doc["sizes"].append(entry)
            for plan in runs.plans(steps):
                if plan.name not in args.plans:
                    continue
                print(f"[tiers] {name} {plan.name} ...", flush=True)
                entry["runs"][plan.name] = _run(shape, plan, steps, data_dir, work)
                print(f"[tiers] {name} {plan.name}: {entry['runs'][plan.name]}", flush=True)
                # After every run: a later run that hangs or is killed loses only itself.
                write_json(os.path.join(args.out, "tiers.json"), merged(args.out, doc))
    print(f"wrote {os.path.join(args.out, 'tiers.json')}; leftover /dev/shm run folders: "
          f"{runs.shm_left('tiers-')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
