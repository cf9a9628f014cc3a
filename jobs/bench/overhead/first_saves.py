"""Where a run's first steps' CPU goes, per rank thread: one fault-free run of a mechanism with
the recovery benchmark's intervals, every rank logging its threads' CPU after each early step
(`EventLog.threads`), printed as CPU-seconds per thread name between consecutive logged steps.

    python jobs/bench/overhead/first_saves.py --size 1gb --durable 2 --local 1 --work /tmp/fs

Run from the checkout with the project's venv active; nothing else may run on the machine. The
run folder (events, processes.json, runner.log) stays under --work.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), os.path.dirname(os.path.dirname(os.path.dirname(HERE)))]

from harness.events import read_events  # noqa: E402 - after the path set-up above
from harness.sizes import size as size_of  # noqa: E402
from harness.spec import Workload  # noqa: E402
from sweep.isolated import run_isolated  # noqa: E402

from ray_resilience.examples.token_data import generate_shards  # noqa: E402

LOGGED_STEPS = (1, 2, 3, 4, 5, 6, 8, 10)


def per_thread(run_dir: str, rank: int) -> list[str]:
    """One line per pair of consecutive logged steps: wall, total CPU, the busiest threads."""
    snaps, times = {}, {}
    for event in read_events(run_dir):
        if event.get("ev") == "threads" and event["rank"] == rank:
            snaps[event["step"]] = {t["tid"]: t for t in event["threads"]}
            times[event["step"]] = event["t"]
    lines = []
    steps = sorted(snaps)
    for a, b in zip(steps[:-1], steps[1:], strict=True):
        used: collections.Counter[str] = collections.Counter()
        for tid, thread in snaps[b].items():
            name = thread["name"].split("-r")[0] if thread["name"].startswith("rr-") \
                else thread["name"]
            used[name] += thread["cpu_s"] - snaps[a].get(tid, {}).get("cpu_s", 0.0)
        top = ", ".join(f"{name} {cpu:.2f}" for name, cpu in used.most_common(7))
        lines.append(f"rank {rank} steps {a}->{b}: wall {times[b] - times[a]:5.1f} s, "
                     f"CPU {sum(used.values()):5.1f} s | {top}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mechanism", default="ours")
    parser.add_argument("--size", default="1gb")
    parser.add_argument("--durable", type=int, default=2, help="checkpoint interval (steps)")
    parser.add_argument("--local", type=int, default=1, help="local tier interval (0: off)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    size = size_of(args.size)
    data = os.path.join(args.work, "data")
    generate_shards(data, seq_len=size.seq_len, vocab_size=size.model.vocab_size)
    run_dir = os.path.join(args.work, f"{args.mechanism}-{os.getpid()}")
    workload = Workload(size=args.size, max_steps=args.steps, world_size=2,
                        checkpoint_interval=args.durable, local_interval=args.local,
                        local_root=f"/dev/shm/rr-first-saves-{os.getpid()}", data_dir=data,
                        run_dir=run_dir, seed=0, detect_timeout_s=size.detect_timeout_s,
                        snapshot_steps=tuple(s for s in LOGGED_STEPS if s <= args.steps))
    result = run_isolated(args.mechanism, workload, timeout_s=900.0)
    print(f"{args.mechanism} at {args.size}: {result['status']} {result.get('error') or ''}")
    for rank in range(workload.world_size):
        print("\n".join(per_thread(run_dir, rank)))
    return 0 if result["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
