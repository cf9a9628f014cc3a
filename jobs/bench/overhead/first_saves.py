"""Where a run's first steps' CPU goes, per rank thread: one fault-free run of a mechanism with
the recovery benchmark's intervals, every rank logging its threads' CPU after each early step
(`EventLog.threads`), printed as CPU-seconds per thread name between consecutive logged steps.

    python jobs/bench/overhead/first_saves.py --size 1gb --durable 2 --local 1 --work /tmp/fs \
        --out docs/benchmarks/first-steps/NAME.json

Run from the checkout with the project's venv active; nothing else may run on the machine. The
run folder (events, processes.json, runner.log) stays under --work; `--out` writes what is
printed, and the run's summed memory and CPU, as JSON. `--from-run RUN_DIR` summarizes a run
folder written earlier instead of running.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), os.path.dirname(os.path.dirname(os.path.dirname(HERE)))]

from harness.events import read_events  # noqa: E402 - after the path set-up above
from harness.sizes import size as size_of  # noqa: E402
from harness.spec import Workload  # noqa: E402
from sweep.isolated import run_isolated  # noqa: E402

from ray_resilience.examples.token_data import generate_shards  # noqa: E402

LOGGED_STEPS = (1, 2, 3, 4, 5, 6, 8, 10)


def intervals(run_dir: str, rank: int) -> list[dict]:
    """Per pair of consecutive logged steps: wall seconds and CPU-seconds per thread name."""
    snaps, times = {}, {}
    for event in read_events(run_dir):
        if event.get("ev") == "threads" and event["rank"] == rank:
            snaps[event["step"]] = {t["tid"]: t for t in event["threads"]}
            times[event["step"]] = event["t"]
    out = []
    steps = sorted(snaps)
    for a, b in zip(steps[:-1], steps[1:], strict=True):
        used: collections.Counter[str] = collections.Counter()
        for tid, thread in snaps[b].items():
            name = thread["name"].split("-r")[0] if thread["name"].startswith("rr-") \
                else thread["name"]
            used[name] += thread["cpu_s"] - snaps[a].get(tid, {}).get("cpu_s", 0.0)
        out.append({"rank": rank, "from": a, "to": b, "wall_s": round(times[b] - times[a], 3),
                    "threads_cpu_s": {k: round(v, 3) for k, v in used.most_common()}})
    return out


def line(interval: dict) -> str:
    """Wall, total CPU and the busiest threads of one interval."""
    used = interval["threads_cpu_s"]
    top = ", ".join(f"{name} {cpu:.2f}" for name, cpu in list(used.items())[:7])
    return (f"rank {interval['rank']} steps {interval['from']}->{interval['to']}: wall "
            f"{interval['wall_s']:5.1f} s, CPU {sum(used.values()):5.1f} s | {top}")


def _code() -> str:
    here = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
    try:
        head = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mechanism", default="ours")
    parser.add_argument("--size", default="1gb")
    parser.add_argument("--durable", type=int, default=2, help="checkpoint interval (steps)")
    parser.add_argument("--local", type=int, default=1, help="local tier interval (0: off)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--work", help="folder for the data and the run (required to run)")
    parser.add_argument("--out", help="write the summary as JSON here")
    parser.add_argument("--from-run", help="summarize this earlier run folder instead of running")
    parser.add_argument("--code", help="the code the run used (default: this checkout's HEAD)")
    args = parser.parse_args()
    if args.from_run:
        with open(os.path.join(args.from_run, "result.json"), encoding="utf-8") as f:
            result = json.load(f)
        started = os.path.getmtime(os.path.join(args.from_run, "request.json"))
        return report(args, args.from_run, result, 2, started=started)
    if not args.work:
        parser.error("--work is required unless --from-run is given")
    size = size_of(args.size)
    data = os.path.join(args.work, "data")
    generate_shards(data, seq_len=size.seq_len, vocab_size=size.model.vocab_size)
    run_dir = os.path.join(args.work, f"{args.mechanism}-{os.getpid()}")
    workload = Workload(size=args.size, max_steps=args.steps, world_size=2,
                        checkpoint_interval=args.durable, local_interval=args.local,
                        local_root=f"/dev/shm/rr-first-saves-{os.getpid()}", data_dir=data,
                        run_dir=run_dir, seed=0, detect_timeout_s=size.detect_timeout_s,
                        snapshot_steps=tuple(s for s in LOGGED_STEPS if s <= args.steps))
    started = time.time()
    result = run_isolated(args.mechanism, workload, timeout_s=900.0)
    return report(args, run_dir, result, workload.world_size, started=started)


def report(args: argparse.Namespace, run_dir: str, result: dict, world_size: int, *,
           started: float | None) -> int:
    """Prints the per-thread lines (and writes them with `--out`); the exit status."""
    print(f"{args.mechanism} at {args.size}: {result['status']} {result.get('error') or ''}")
    rows = [i for rank in range(world_size) for i in intervals(run_dir, rank)]
    for interval in rows:
        print(line(interval))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"command": " ".join(sys.argv), "code": args.code or _code(),
                       "started": started, "mechanism": args.mechanism, "size": args.size,
                       "durable_every": args.durable, "local_every": args.local,
                       "status": result["status"], "usage": result.get("usage"),
                       "intervals": rows}, f, indent=1)
    return 0 if result["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
