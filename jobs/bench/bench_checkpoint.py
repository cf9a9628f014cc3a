"""Checkpoint benchmark: what each checkpoint method costs the training loop.

    python jobs/bench/bench_checkpoint.py --quick            # a few minutes
    python jobs/bench/bench_checkpoint.py                    # full sweep
    ray job submit --working-dir . -- python jobs/bench/bench_checkpoint.py --address auto

For the tiny and the "small" (~400-500 MB of parameters + AdamW state) LLaMA, FSDP2 on gloo, it
sweeps the checkpoint interval (the shortest makes the write time exceed the time between saves)
and compares, in one run on the same ranks: (a) synchronous torch.save of each rank's shards,
(b) synchronous DCP save, (c) DCP async_save, (d) ours with each in-flight policy. Per
configuration: training-thread blocking per save (median, p99), the AWS formula
100 - 100 x sum(blocking) / wall, throughput efficiency (steps/s with saves / steps/s without,
same ranks, same run), end-to-end save latency (call to durable; ours: to committed), memory held.
Writes JSON to --results and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import sys
import tempfile
import time
from typing import Any

import ray
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "jobs", "bench")]
# The imports below need the two folders above on sys.path (E402 on purpose).
from bench_checkpoint_rank import BenchRank  # noqa: E402 - see above

from ray_resilience._internal.checkpoint.service.service import (  # noqa: E402 - see above
    CheckpointService,
)
from ray_resilience.checkpoint import CheckpointConfig  # noqa: E402 - see above
from ray_resilience.checkpoint.config import WRITER_PRIORITIES  # noqa: E402 - see above

METHODS = ["torch_save", "dcp_sync", "dcp_async", "ours_coalesce", "ours_skip", "ours_block"]
SWEEPS = {  # preset: (steps per configuration, intervals)
    "quick": {"tiny": (30, [1, 10]), "small": (12, [1, 4])},
    "full": {"tiny": (400, [1, 10, 40]), "small": (40, [1, 5, 20])},
}


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def summarize(preset: str, method: str, interval: int, results: list[dict], baseline_wall: float,
              steps: int, extra: dict[str, Any]) -> dict[str, Any]:
    blocking = [b for r in results for b in r["blocking_s"]]
    latency = [x for r in results for x in r["latency_s"]]
    wall = max(r["wall_s"] for r in results)
    aws = statistics.mean(100 - 100 * sum(r["blocking_s"]) / r["wall_s"] for r in results)
    return {
        "model": preset, "method": method, "interval": interval, "steps": steps,
        "saves": len(results[0]["blocking_s"]), "wall_s": wall,
        "blocking_median_s": pct(blocking, 0.5), "blocking_p99_s": pct(blocking, 0.99),
        "blocking_cpu_median_s": pct([c for r in results for c in r.get("blocking_cpu_s", [])],
                                     0.5),
        "aws_efficiency_pct": aws, "throughput_efficiency_pct": 100 * baseline_wall / wall,
        "latency_median_s": pct(latency, 0.5), "latency_p99_s": pct(latency, 0.99),
        "held_mb": (sum(r["held_bytes"] for r in results) + extra.get("writer_bytes", 0)) / 1e6,
        "skipped": sum(r["skipped"] for r in results),
        "coalesced": sum(r["coalesced"] for r in results),
        "failed": sum(r["failed"] for r in results),
        "phases_median_s": [r.get("phases_median_s", {}) for r in results],
        **{k: v for k, v in extra.items() if k != "writer_bytes"},
    }


class Bench:
    """Ranks of one model preset, reused across every configuration."""

    def __init__(self, preset: str, world_size: int, storage: str, writer_priority: str) -> None:
        self.writer_priority = writer_priority
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        actor = ray.remote(BenchRank).options(num_cpus=1, max_concurrency=2)
        self.preset, self.storage, self.world_size = preset, storage, world_size
        self.ranks = [actor.remote(r, world_size, port, preset) for r in range(world_size)]
        self.node = ray.get_runtime_context().get_node_id()
        self.state_bytes = sum(ray.get([r.state_bytes.remote() for r in self.ranks]))

    def run(self, method: str, interval: int, steps: int) -> tuple[list[dict], dict]:
        folder = os.path.join(self.storage, f"{self.preset}-{method}-{interval}")
        service, extra = None, {}
        if method.startswith("ours"):
            service = CheckpointService.start(
                storage_path=self.storage, run_name=f"{self.preset}-{method}-{interval}",
                storage_filesystem=None, world_size=self.world_size,
                node_ids_by_rank=[self.node] * self.world_size,
                config=CheckpointConfig(in_flight_policy=method.split("_", 1)[1],
                                        writer_priority=self.writer_priority))
            # Steady-state saves only: the service's one-time import of DCP (a few CPU-seconds,
            # which a run overlaps with its ranks' start-up) must not compete with the timed steps.
            service.wait_ready()
            specs = [service.rank_spec(r) for r in range(self.world_size)]
            ray.get([rank.attach.remote(spec)
                     for rank, spec in zip(self.ranks, specs, strict=True)])
        try:
            results = ray.get([r.run.remote(method, interval, steps, folder) for r in self.ranks])
            if service is not None:
                extra = self._service_extra(service)
        finally:
            if service is not None:
                service.shutdown()
                shutil.rmtree(os.path.join(self.storage, f"{self.preset}-{method}-{interval}"),
                              ignore_errors=True)
        return results, extra

    @staticmethod
    def _service_extra(service: CheckpointService) -> dict[str, Any]:
        deadline = time.monotonic() + 60
        stats = service.stats()
        while stats["pending_steps"] and time.monotonic() < deadline:
            time.sleep(0.2)
            stats = service.stats()
        commits = stats["commit_latency_s"]
        return {"committed": stats["counts"].get("committed", 0),
                "commit_latency_median_s": pct(commits, 0.5),
                "commit_latency_p99_s": pct(commits, 0.99),
                "writer_bytes": stats["memory_bytes"]}

    def close(self) -> None:
        ray.get([r.close.remote() for r in self.ranks], timeout=120)
        for r in self.ranks:
            ray.kill(r)


def run_preset(preset: str, steps: int, intervals: list[int],
               args: argparse.Namespace) -> list[dict]:
    bench = Bench(preset, args.world_size, args.storage, args.writer_priority)
    rows = []
    try:
        print(f"[{preset}] {bench.state_bytes / 1e6:.0f} MB of model + optimizer state "
              f"across {args.world_size} ranks", flush=True)
        bench.run("none", 1, 2)  # warm-up
        for interval in intervals:
            baseline = max(r["wall_s"] for r in bench.run("none", interval, steps)[0])
            first = len(rows)
            for method in args.methods:
                results, extra = bench.run(method, interval, steps)
                extra["state_mb"] = bench.state_bytes / 1e6
                rows.append(summarize(preset, method, interval, results, baseline, steps, extra))
                print_table(rows[-1:], header=not rows[:-1])
            # The machine is shared: take the no-checkpoint speed before and after the methods.
            after = max(r["wall_s"] for r in bench.run("none", interval, steps)[0])
            for row in rows[first:]:
                row["throughput_efficiency_pct"] = 100 * (baseline + after) / 2 / row["wall_s"]
                row["baseline_wall_s"] = [baseline, after]
    finally:
        bench.close()
    return rows


def fmt(value: Any, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def print_table(rows: list[dict], header: bool = True) -> None:
    cols = ("model", "interval", "method", "saves", "block med ms", "block p99 ms", "of it CPU ms",
            "AWS eff %", "thru eff %", "latency med s", "latency p99 s", "held MB", "skip/coal")
    if header:
        print("  ".join(f"{c:>13}" for c in cols), flush=True)
    for r in rows:
        latency = (r.get("commit_latency_median_s"), r.get("commit_latency_p99_s")) \
            if r["method"].startswith("ours") else (r["latency_median_s"], r["latency_p99_s"])
        cells = (r["model"], r["interval"], r["method"], r["saves"],
                 fmt(r["blocking_median_s"], 1e3), fmt(r["blocking_p99_s"], 1e3),
                 fmt(r.get("blocking_cpu_median_s"), 1e3, 2),
                 fmt(r["aws_efficiency_pct"], digits=2), fmt(r["throughput_efficiency_pct"]),
                 fmt(latency[0], digits=2), fmt(latency[1], digits=2),
                 fmt(r["held_mb"], digits=0), f"{r['skipped']}/{r['coalesced']}")
        print("  ".join(f"{str(c):>13}" for c in cells), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short sweep (a few minutes)")
    parser.add_argument("--models", nargs="+", default=["tiny", "small"])
    parser.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    parser.add_argument("--intervals", nargs="+", type=int, default=None, help="override the sweep")
    parser.add_argument("--steps", type=int, default=None, help="steps per configuration override")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--storage", default=None, help="checkpoint folder (default: a temp dir)")
    parser.add_argument("--results", default=os.path.join(ROOT, "results", "bench_checkpoint"))
    parser.add_argument("--address", default=None,
                        help="Ray address (default: a private local Ray)")
    parser.add_argument("--writer-priority", default=CheckpointConfig().writer_priority,
                        choices=list(WRITER_PRIORITIES),
                        help="CheckpointConfig.writer_priority for ours")
    args = parser.parse_args()
    args.storage = args.storage or tempfile.mkdtemp(prefix="rr-bench-ckpt-")
    ray_dir = None
    env = {"PYTHONPATH": os.pathsep.join([ROOT, os.path.join(ROOT, "jobs")])}
    if args.address:
        ray.init(address=args.address, runtime_env={"env_vars": env})
    else:
        os.environ.pop("RAY_ADDRESS", None)  # a private Ray, never someone else's cluster
        ray_dir = tempfile.mkdtemp(prefix="rr-bench-ray-", dir="/tmp")
        ray.init(address="local", num_cpus=args.world_size + 1, include_dashboard=False,
                 _temp_dir=ray_dir, runtime_env={"env_vars": env})
    sweep = SWEEPS["quick" if args.quick else "full"]
    rows: list[dict] = []
    try:
        for preset in args.models:
            steps, intervals = sweep[preset]
            steps, intervals = args.steps or steps, args.intervals or intervals
            rows += run_preset(preset, steps, intervals, args)
    finally:
        ray.shutdown()
        shutil.rmtree(args.storage, ignore_errors=True)
        if ray_dir:
            shutil.rmtree(ray_dir, ignore_errors=True)
    os.makedirs(args.results, exist_ok=True)
    path = os.path.join(args.results, f"bench_checkpoint_{time.strftime('%Y%m%d-%H%M%S')}.json")
    meta = {"torch": torch.__version__, "ray": ray.__version__, "cpus": os.cpu_count(),
            "python": platform.python_version(), "world_size": args.world_size, "quick": args.quick,
            "writer_priority": args.writer_priority}
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print("\nall configurations:\n")
    print_table(rows)
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
