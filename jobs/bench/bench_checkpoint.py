"""Checkpoint benchmark: what each checkpoint method costs the training loop, like for like.

    python jobs/bench/bench_checkpoint.py --quick                 # tiny size, 1 repetition
    python jobs/bench/bench_checkpoint.py --out docs/benchmarks   # 3 sizes, 3 repetitions

At every state size (`harness/sizes.py`), FSDP2 LLaMA on 2 gloo ranks in Ray actors trains with
one method at a time (`ckpt/savers.py`): torch.save and DCP sync (references), DCP async_save as
the recovery peers use it (thread checkpointer, async staging, plan caching), its process
checkpointer variant and a skip-when-busy variant, ours with each in-flight policy, ours' local
tier and NVRx's local checkpoints as rows of their own. Pairs that persist the same saves:
ours `block` vs DCP async (every save), ours `coalesce`/`skip` vs DCP async skip-when-busy
(saves dropped while one is in flight). Per configuration (`ckpt/summary.py`): blocking,
AWS efficiency, throughput efficiency against the no-checkpoint run of the same repetition,
persisted fraction and staleness. Writes `checkpoint.json` into --out; a rerun of some sizes
into a folder that holds results replaces only those sizes' rows (each size keeps the command,
date and repetitions of the sitting that measured it), so the sizes can run in sittings:

    python jobs/bench/bench_checkpoint.py --sizes 1gb --out docs/benchmarks
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [BENCH, os.path.dirname(os.path.dirname(BENCH))]

import ray  # noqa: E402 - after the path set-up above
from ckpt.driver import Bench  # noqa: E402
from ckpt.rank import WARM_UP_SAVES  # noqa: E402
from ckpt.savers import DURABLE, METHODS  # noqa: E402
from ckpt.sittings import merged, sitting  # noqa: E402
from ckpt.summary import pool, score_rep  # noqa: E402
from harness.launcher import with_bench_paths  # noqa: E402
from harness.sizes import SIZES  # noqa: E402
from sweep import machine  # noqa: E402
from sweep.results import write_json  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny size, 1 repetition")
    p.add_argument("--sizes", default=None, help=f"comma-separated from {', '.join(SIZES)}")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--reps", type=int, default=None, help="repetitions (default 3; --quick: 1)")
    p.add_argument("--out", default=None, help="result folder (default results/bench/<time>)")
    args = p.parse_args(argv)
    sizes = args.sizes or ("tiny" if args.quick else ",".join(SIZES))
    args.sizes = [s for s in sizes.split(",") if s]
    args.methods = [m for m in args.methods.split(",") if m]
    for names, choices, flag in ((args.sizes, SIZES, "--sizes"),
                                 (args.methods, METHODS, "--methods")):
        unknown = [n for n in names if n not in choices]
        if unknown:
            p.error(f"{flag}: unknown {unknown}; choose from {', '.join(choices)}")
    args.reps = args.reps or (1 if args.quick else 3)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.out = os.path.abspath(args.out or os.path.join("results", "bench", stamp))
    return args


def run_size(size_name: str, args: argparse.Namespace, storage: str,
             shm: str) -> tuple[list[dict], list[dict]]:
    """The size's pooled rows, and the configurations of a repetition that failed (the ranks
    are started anew after one, and the sitting goes on)."""
    size = SIZES[size_name]
    steps = size.checkpoint_steps // (2 if args.quick and size_name != "tiny" else 1)
    configs = [(m, k) for k in size.checkpoint_intervals for m in args.methods]
    bench = Bench(size_name, 2, storage, shm)
    state_mb = bench.state_bytes / 1e6
    per_config: dict[tuple[str, int], list[dict]] = {}
    failures: list[dict] = []
    try:
        print(f"[{size_name}] {state_mb:.0f} MB of state on 2 ranks", flush=True)
        bench.run("none", 1, steps)  # untimed: first-run effects stay out of every baseline
        for rep in range(args.reps):
            order = [("none", 0), *configs]
            order = order[rep % len(order):] + order[:rep % len(order)]
            baseline, results = None, []
            for method, interval in order:
                if size.checkpoint_fresh_ranks:
                    bench.close()
                    bench = Bench(size_name, 2, storage, shm)
                try:
                    result = bench.run(method, interval or 1, steps)
                except (ray.exceptions.RayError, TimeoutError) as exc:
                    why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
                    failures.append({"size": size_name, "method": method, "interval": interval,
                                     "rep": rep, "error": why})
                    print(f"  rep {rep} {method} every {interval}: FAILED ({why})", flush=True)
                    bench.close(kill=True)
                    bench = Bench(size_name, 2, storage, shm)
                    continue
                if method == "none":
                    baseline = {"wall_s": max(r["wall_s"] for r in result["ranks"]),
                                "machine_cpu_s": result["ranks"][0]["usage"]["machine_cpu_s"]}
                else:
                    results.append((method, interval, result))
                print(f"  rep {rep} {method} every {interval}: done", flush=True)
            for method, interval, result in results:
                if baseline is None:
                    continue  # the repetition's no-checkpoint run failed (listed): no yardstick
                scored = score_rep(result, method, baseline, WARM_UP_SAVES)
                per_config.setdefault((method, interval), []).append(scored)
    finally:
        bench.close()
    rows = [{"size": size_name, "method": m, "interval": k, "steps": steps,
             "durable": m in DURABLE, "state_mb": state_mb, **pool(reps)}
            for (m, k), reps in per_config.items()]
    return rows, failures


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    given = sys.argv[1:] if argv is None else argv
    command = "python jobs/bench/bench_checkpoint.py " + shlex.join(given)
    info = machine.describe(command)
    storage = tempfile.mkdtemp(prefix="rrbench-ckpt-")
    shm = tempfile.mkdtemp(prefix="rrbench-ckpt-", dir="/dev/shm")
    ray_dir = tempfile.mkdtemp(prefix="rrb_ray_", dir="/tmp")
    os.environ.pop("RAY_ADDRESS", None)  # a private Ray, never someone else's cluster
    started, rows, failures = time.time(), [], []
    try:
        ray.init(address="local", num_cpus=3, include_dashboard=False, _temp_dir=ray_dir,
                 log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": with_bench_paths("")}})
        for size_name in args.sizes:
            size_rows, size_failures = run_size(size_name, args, storage, shm)
            rows += size_rows
            failures += size_failures
    finally:
        ray.shutdown()
        for folder in (storage, shm, ray_dir):
            shutil.rmtree(folder, ignore_errors=True)
    document = {"benchmark": "checkpoint", **info, "quick": args.quick, "reps": args.reps,
                "world_size": 2, "rows": rows, "failures": failures,
                "duration_s": round(time.time() - started, 1)}
    document["sittings"] = dict.fromkeys(args.sizes, sitting(document))
    path = os.path.join(args.out, "checkpoint.json")
    print(f"wrote {write_json(path, merged(path, document))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
