"""Control-plane benchmark: the real supervisor, node agents, detection and commit coordinator
driven by N virtual ranks on a local multi-node Ray cluster (no torch).

    python jobs/bench/bench_control_plane.py --quick      # N = 64, 256, 1024: a few minutes
    python jobs/bench/bench_control_plane.py              # N = 64 ... 4096, 10,000-step memory run

Per N: supervisor CPU (fraction of a core) and RSS in steady training, batches and reports per
second, detection latency of a dead rank, a hung rank and a lost node, time to decide and launch
the recovery, save-round time per-rank vs per-node votes. Writes JSON (schema in
controlplane/report.py) and a plot; `render.py` puts the table into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from typing import Any

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(BENCH))
sys.path[:0] = [ROOT, BENCH]

import ray  # noqa: E402 - after the path set-up above
from controlplane import measure, report  # noqa: E402
from controlplane.host import RankHost  # noqa: E402
from controlplane.probe import ProbeCallback  # noqa: E402
from controlplane.rounds import save_rounds  # noqa: E402
from controlplane.sim_group import HostSlot, sim_group_factory  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

import ray_resilience as rr  # noqa: E402
from ray_resilience._internal.constants import SUPERVISOR_MAX_CONCURRENCY  # noqa: E402
from ray_resilience._internal.supervisor.supervisor import Supervisor  # noqa: E402

RANKS_PER_NODE = 16
HOST_NODES = 3
"""Ray nodes hosting virtual ranks (besides the head: supervisor, coordinator, driver)."""


def _without_out(argv: list[str]) -> list[str]:
    """The command line as run, less the machine-specific `--out DIR`."""
    out, skip = [], False
    for arg in argv:
        if skip or arg.startswith("--out="):
            skip = False
            continue
        skip = arg == "--out"
        if not skip:
            out.append(arg)
    return out


def resilience(step_timeout_s: float, heartbeat_timeout_s: float) -> rr.ResilienceConfig:
    """The defaults, with a short hang timeout so hang trials are quick, and budgets for many
    trials."""
    return rr.ResilienceConfig(
        in_process=rr.InProcessConfig(max_restarts=10_000, max_attempts_without_progress=10_000),
        in_job=rr.InJobConfig(max_restarts=10_000, max_attempts_without_progress=10_000,
                              num_prestarted_workers=0,
                              heartbeat_timeout_s=heartbeat_timeout_s),
        step_timeout_s=step_timeout_s, first_step_timeout_s=60.0)


def start_hosts(nodes: list[str], interval_s: float, step_s: float, world: int) -> list[Any]:
    return [ray.remote(RankHost).options(
        num_cpus=0, max_concurrency=world + 1000,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
    ).remote(interval_s, step_s) for node in nodes]


def one_size(cluster: Cluster, spare: list[Any], world: int, args: argparse.Namespace,
             ) -> dict[str, Any]:
    """Every measurement of one N; the cluster keeps its host nodes, each lost-node trial
    removes one of the `spare` nodes started with the cluster."""
    host_nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("host")]
    victims = [spare.pop() for _ in range(args.node_trials)]
    victim_ids = [v.node_id for v in victims]
    hosts = start_hosts(host_nodes + victim_ids, args.interval, args.step_s, world)
    sims = world // RANKS_PER_NODE
    names = [f"sim{i}" for i in range(sims)]
    main = [HostSlot(h, n, tuple(names[i::len(host_nodes)])) for i, (h, n)
            in enumerate(zip(hosts[:len(host_nodes)], host_nodes, strict=True))]
    extra = [HostSlot(h, n, (f"victim{i}",)) for i, (h, n)
             in enumerate(zip(hosts[len(host_nodes):], victim_ids, strict=True))]
    # Ranks of the victims' simulated nodes come last in rank order.
    slots = main + extra
    total = world + RANKS_PER_NODE * len(extra)
    probe = measure.new_probe()
    storage = tempfile.mkdtemp(prefix="rr-bench-cp-")
    supervisor = ray.remote(Supervisor).options(
        num_cpus=0, max_concurrency=SUPERVISOR_MAX_CONCURRENCY,
        scheduling_strategy=NodeAffinitySchedulingStrategy(
            ray.get_runtime_context().get_node_id(), soft=False),
    ).remote(train_fn=b"", train_config=None, scaling=rr.ScalingConfig(num_workers=total),
             resilience=resilience(args.step_timeout, args.heartbeat_timeout),
             run_name="bench", run_dir=storage,
             env_vars={}, storage_path=storage, callbacks=[ProbeCallback(probe)],
             worker_group_factory=sim_group_factory(slots, RANKS_PER_NODE))
    run_ref = supervisor.run.remote()
    events = measure.Events(probe)
    events.wait_for(lambda e: e["hook"] == "step", 300)
    watch = measure.Watch(supervisor)
    rank_host = _rank_hosts(slots, total)
    out: dict[str, Any] = {"world_size": total, "nodes": sims + len(extra),
                           "steady": measure.steady(supervisor, watch, args.window)}
    out["dead_rank"] = measure.trials(events, rank_host.__getitem__, world, args.dead_trials,
                                      "died", 60, seed=world)
    out["hung_rank"] = measure.trials(events, rank_host.__getitem__, world, args.hang_trials,
                                      "hang", args.step_timeout + 60, seed=world + 1)
    out["lost_node"] = [measure.guarded(events, lambda v=v: _remove(cluster, v), None, 120)
                        for v in victims]
    out["memory"] = None
    if world >= args.memory_at:
        ray.get([h.set_step_s.remote(args.memory_step_s, args.memory_report_every)
                 for h in hosts[:len(host_nodes)]])
        out["memory"] = measure.memory_run(supervisor, watch, args.memory_steps,
                                           args.memory_timeout)
        ray.get([h.set_step_s.remote(args.step_s) for h in hosts[:len(host_nodes)]])
    out["steady_after"] = measure.steady(supervisor, watch, args.window)
    ray.get([h.end.remote(list(range(total)), "finished") for h in hosts[:len(host_nodes)]],
            timeout=60)
    outcome = ray.get(run_ref, timeout=300)
    out["run_state"], out["control"] = outcome.state, outcome.control
    out["save_rounds"] = save_rounds(hosts[:len(host_nodes)], total, args.rounds)
    for actor in [supervisor, probe, *hosts]:
        ray.kill(actor)
    return out


def _rank_hosts(slots: list[HostSlot], world: int) -> dict[int, Any]:
    """Rank -> host, matching `SimGroup`'s placement."""
    sims = [(s.handle, n) for s in slots for n in s.sim_nodes]
    return {r: sims[(r // RANKS_PER_NODE) % len(sims)][0] for r in range(world)}


def _remove(cluster: Cluster, node: Any) -> float:
    t0 = time.time()
    cluster.remove_node(node, allow_graceful=False)
    return t0


def start_cluster(victims: int, tries: int = 6) -> tuple[Cluster, list[Any]]:
    """The head (driver, supervisor, coordinator), the host nodes and `victims` nodes for the
    lost-node trials; retried whole, since Ray gives a node 30 s to register and a loaded
    machine can miss that."""
    for attempt in range(tries):
        try:
            cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
            for _ in range(HOST_NODES):
                cluster.add_node(num_cpus=1, resources={"host": 1})
            spare = [cluster.add_node(num_cpus=1, resources={"victim": 1})
                     for _ in range(victims)]
            cluster.wait_for_nodes()
            return cluster, spare
        except Exception as exc:
            print(f"cluster start failed ({exc}); retrying", flush=True)
            if attempt == tries - 1:
                raise
            time.sleep(10.0)
            try:
                cluster.shutdown()
            except Exception:  # noqa: BLE001 - half-started: nothing more to stop
                pass
    raise AssertionError("unreachable")


def machine() -> dict[str, Any]:
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version(), "ray": ray.__version__,
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--sizes", type=int, nargs="*")
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "benchmarks", "control_plane"))
    p.add_argument("--interval", type=float, default=0.25, help="progress_interval_s")
    p.add_argument("--step-s", type=float, default=0.5, help="simulated step time")
    p.add_argument("--step-timeout", type=float, default=3.0)
    p.add_argument("--heartbeat-timeout", type=float, default=10.0,
                   help="InJobConfig.heartbeat_timeout_s (its default)")
    p.add_argument("--window", type=float, default=15.0)
    p.add_argument("--dead-trials", type=int, default=20)
    p.add_argument("--hang-trials", type=int, default=5)
    p.add_argument("--node-trials", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--memory-steps", type=int, default=10_000)
    p.add_argument("--memory-at", type=int, default=4096, help="smallest N with a memory run")
    p.add_argument("--memory-step-s", type=float, default=0.02, help="step time of that run")
    p.add_argument("--memory-report-every", type=int, default=10,
                   help="steps between a rank's reports in that run")
    p.add_argument("--memory-timeout", type=float, default=1800.0)
    args = p.parse_args(argv)
    if args.quick:
        args.sizes = args.sizes or [64, 256, 1024]
        args.window, args.dead_trials, args.hang_trials = 8.0, 8, 3
        args.node_trials, args.rounds = 1, 3
        args.memory_steps, args.memory_at = 2_000, 1024
    sizes = args.sizes or [64, 256, 1024, 4096]
    t_start = time.time()
    cluster, spare = start_cluster(len(sizes) * args.node_trials)
    ray.init(address=cluster.address,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([ROOT, BENCH])}})
    doc = {"schema": report.SCHEMA, "quick": args.quick, "machine": machine(),
           "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"),
           "command": shlex.join(["python", "jobs/bench/bench_control_plane.py",
                                  *_without_out(sys.argv[1:])]),
           "settings": {k: v for k, v in vars(args).items() if k not in ("out", "quick")},
           "ranks_per_node": RANKS_PER_NODE, "sizes": []}
    try:
        for world in sizes:
            print(f"N={world} ...", flush=True)
            doc["sizes"].append(one_size(cluster, spare, world, args))
            print(json.dumps(report.summary_row(doc["sizes"][-1])), flush=True)
    finally:
        doc["duration_s"] = time.time() - t_start
        doc["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        os.makedirs(args.out, exist_ok=True)
        path = os.path.join(args.out, "control_plane.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
        report.plot(doc, os.path.join(args.out, "control_plane.png"))
        print(f"wrote {path}")
        ray.shutdown()
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
