"""Recovery benchmark: the same workload and fault plan through every recovery mechanism.

    python jobs/bench/bench_recovery.py --quick --mechanisms ray-train,nvrx-ft-launcher,torchrun
    python jobs/bench/bench_recovery.py            # 200 steps, 5 faults (AWS generator, seed 42)

A scaled-down AWS/NVRx fault-recovery experiment for one machine: tiny FSDP2 LLaMA, 2 CPU ranks
(gloo), the AWS schedule generator (seed 42, faults after step 10, never rank 0). For each
mechanism it first trains without faults (the steady step time, the save cost, and the
parameters every faulty run must end with) and a short fault-free run saving at every step
(what one save costs the run end to end, background work included), then with the plan at each
requested checkpoint interval: "best" (Young's optimal interval for that save cost and the
plan's fault rate) and "quarter" (the reference's ratio: one save per quarter of the run).
Prints one table; writes results.json and comparison PNGs to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
import traceback
from typing import Any

from peers import MECHANISMS, make_peer
from peers.report import Row, print_table, write_plots, write_results
from peers.spec import PeerRun, Workload, unsupported_kinds
from peers.workload import params_equal
from rich.console import Console

from ray_resilience.examples.llama import PRESETS
from ray_resilience.examples.token_data import generate_shards
from ray_resilience.goodput import RunTimeline, compute_goodput
from ray_resilience.testing import FaultPlan

console = Console(width=200)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="60 steps, 3 faults (a few minutes)")
    p.add_argument("--mechanisms", default=",".join(MECHANISMS),
                   help=f"comma-separated, from: {', '.join(MECHANISMS)}")
    p.add_argument("--checkpoint_interval", default="best,quarter",
                   help="comma-separated: best, quarter, or a step count")
    p.add_argument("--max_steps", type=int, default=None, help="default 200 (--quick: 60)")
    p.add_argument("--fault_count", type=int, default=None, help="default 5 (--quick: 3)")
    p.add_argument("--fault_seed", type=int, default=42)
    p.add_argument("--fault_after_step", type=int, default=10)
    p.add_argument("--fault_kinds", default="exception,sigkill",
                   help="comma-separated FaultKind values for the AWS generator")
    p.add_argument("--world_size", type=int, default=2)
    p.add_argument("--model", default="tiny", choices=sorted(PRESETS))
    p.add_argument("--batch_size", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reference_steps", type=int, default=None,
                   help="steps of the fault-free reference run (default: --max_steps). Shorter "
                        "saves time on long runs: the steady step time and save cost come from "
                        "it, but the faulty runs' parameters are then not compared bit for bit")
    p.add_argument("--run_timeout_s", type=float, default=900.0,
                   help="deadline for one run of one mechanism")
    p.add_argument("--out", default=None, help="default results/bench_recovery/<timestamp>/")
    p.add_argument("--rescore", default=None, metavar="RESULTS_JSON",
                   help="train nothing: re-score the runs recorded in an earlier results.json "
                        "with this code's goodput accounting, print the table, rewrite it")
    args = p.parse_args(argv)
    args.max_steps = args.max_steps or (60 if args.quick else 200)
    args.fault_count = args.fault_count if args.fault_count is not None else (
        3 if args.quick else 5)
    args.reference_steps = args.reference_steps or args.max_steps
    if not 0 < args.reference_steps <= args.max_steps:
        p.error(f"--reference_steps={args.reference_steps} must be in 1..--max_steps "
                f"({args.max_steps})")
    args.mechanisms = [m.strip() for m in args.mechanisms.split(",") if m.strip()]
    unknown = [m for m in args.mechanisms if m not in MECHANISMS]
    if unknown:
        p.error(f"--mechanisms: unknown {unknown}; choose from {', '.join(MECHANISMS)}")
    args.checkpoint_interval = [c.strip() for c in args.checkpoint_interval.split(",")]
    for choice in args.checkpoint_interval:
        if choice not in ("best", "quarter") and not (choice.isdigit() and int(choice) > 0):
            p.error(f"--checkpoint_interval: {choice!r} is not best, quarter or a step count")
    args.out = os.path.abspath(args.out or os.path.join(
        "results", "bench_recovery", time.strftime("%Y%m%d-%H%M%S")))
    return args


def young_interval(save_cost_s: float, step_time_s: float, max_steps: int,
                   fault_count: int) -> int:
    """Young's optimal checkpoint interval sqrt(2 x save cost x MTBF), in steps, at most a
    quarter of the run (the reference's ratio: a run keeps some checkpoint in storage).

    The save cost and step time are the mechanism's own, measured in its fault-free run; the
    mean time between failures is the plan's (max_steps / fault_count steps), counting only
    faults that roll the mechanism back to its last checkpoint.
    """
    quarter = max(1, max_steps // 4)
    if fault_count == 0 or step_time_s <= 0:
        return quarter
    mtbf_steps = max_steps / fault_count
    return max(1, min(quarter, round(math.sqrt(2 * (save_cost_s / step_time_s) * mtbf_steps))))


def resolve_intervals(choices: list[str], *, save_cost_s: float, step_time_s: float,
                      max_steps: int, fault_count: int) -> dict[str, int]:
    """Label -> interval; labels whose intervals coincide are merged ("best=quarter")."""
    by_interval: dict[int, list[str]] = {}
    for choice in choices:
        if choice == "best":
            k = young_interval(save_cost_s, step_time_s, max_steps, fault_count)
        elif choice == "quarter":
            k = max(1, max_steps // 4)
        else:
            k, choice = int(choice), "given"
        by_interval.setdefault(k, []).append(choice)
    return {"=".join(dict.fromkeys(labels)): k for k, labels in by_interval.items()}


def _safe_run(peer: Any, workload: Workload) -> PeerRun:
    """A peer that crashes the benchmark's own code must not take the other mechanisms down."""
    try:
        return peer.run(workload)
    except Exception as exc:  # noqa: BLE001 - reported in the table and error.txt
        os.makedirs(workload.run_dir, exist_ok=True)
        with open(os.path.join(workload.run_dir, "error.txt"), "w", encoding="utf-8") as f:
            f.write(traceback.format_exc())
        return PeerRun(mechanism=peer.name, checkpoint_interval=workload.checkpoint_interval,
                       faulty=len(workload.fault_plan) > 0, status="failed",
                       error=f"{type(exc).__name__}: {exc}", run_dir=workload.run_dir)


CALIBRATION_STEPS = 100
"""Steps of the fault-free calibration run that saves at every step."""


def per_step_wall_s(timeline: Any) -> float | None:
    """Wall seconds per step from the second completed step to the last (start-up excluded)."""
    steps = sorted(timeline.steps, key=lambda e: e.t)
    if len(steps) < 3 or steps[-1].step <= steps[1].step:
        return None
    return (steps[-1].t - steps[1].t) / (steps[-1].step - steps[1].step)


def _calibrated_save_cost(peer: Any, base: Workload, args: argparse.Namespace, ref_timeline: Any,
                          blocking_s: float) -> float:
    """What one save costs the run end to end: a fault-free run saving at every step, against
    the reference (saving every quarter), per step. A background write that competes with
    training for the CPU costs throughput, not blocking; Young's formula needs the whole cost.
    Never below the measured blocking."""
    if not getattr(peer, "uses_checkpoints", True):
        return blocking_s
    steps = min(CALIBRATION_STEPS, base.max_steps)
    console.log(f"{peer.name}: fault-free calibration run, checkpoint every step ({steps} steps)")
    cal = _safe_run(peer, base.with_(fault_plan=FaultPlan.none(), checkpoint_interval=1,
                                     max_steps=steps,
                                     run_dir=os.path.join(args.out, peer.name, "calibration")))
    with_saves = per_step_wall_s(cal.timeline) if cal.status == "ok" and cal.timeline else None
    without = per_step_wall_s(ref_timeline)
    if with_saves is None or without is None:
        return blocking_s
    return max(blocking_s, with_saves - without)


def bench_mechanism(name: str, base: Workload, args: argparse.Namespace,
                    references: dict[str, dict[str, Any]]) -> list[Row]:
    """Reference run, then one faulty run per interval; rows for the table."""
    def row(label: str, k: int | None, status: str, error: str | None) -> Row:
        return Row(mechanism=name, label=label, checkpoint_interval=k, status=status, error=error)

    peer = make_peer(name, timeout_s=args.run_timeout_s)
    why = peer.available()
    if why is not None:
        return [row("-", None, "unavailable", why)]
    missing = unsupported_kinds(peer, base.fault_plan)
    if missing:
        return [row("-", None, "skipped", f"cannot detect/recover fault kinds {missing}")]
    quarter = max(1, base.max_steps // 4)
    ref_steps = args.reference_steps
    console.log(f"{name}: fault-free reference run, {ref_steps} steps "
                f"(checkpoint every {max(1, ref_steps // 4)})")
    ref = _safe_run(peer, base.with_(fault_plan=FaultPlan.none(),
                                     checkpoint_interval=max(1, ref_steps // 4),
                                     max_steps=ref_steps,
                                     run_dir=os.path.join(args.out, name, "reference")))
    if ref.status != "ok" or ref.timeline is None:
        return [row("-", None, ref.status, f"fault-free reference run: {ref.error}")]
    ref_report = compute_goodput(ref.timeline)
    steady = ref_report.steady_step_time_s or 0.0
    blocking = ((ref_report.checkpoint_blocking_s - ref_report.local_snapshot_blocking_s)
                / max(1, ref_report.num_checkpoints_saved))
    save_cost = _calibrated_save_cost(peer, base, args, ref.timeline, blocking)
    local_kinds = getattr(peer, "local_restore_kinds", frozenset())
    rollbacks = sum(1 for f in base.fault_plan if f.kind not in local_kinds)
    intervals = resolve_intervals(args.checkpoint_interval, save_cost_s=save_cost,
                                  step_time_s=steady, max_steps=base.max_steps,
                                  fault_count=rollbacks)
    if not getattr(peer, "uses_checkpoints", True):
        intervals = {"no checkpoints": quarter}  # torchft heals from peers: one run is enough
    references[name] = {"steady_step_time_s": steady, "save_cost_s": save_cost,
                        "save_blocking_s": blocking,
                        "wall_s": ref_report.wall_s, "intervals": intervals,
                        "run_dir": ref.run_dir, "notes": ref.notes}
    rows = []
    for label, k in intervals.items():
        console.log(f"{name}: faulty run, checkpoint every {k} ({label})")
        run = _safe_run(peer, base.with_(checkpoint_interval=k,
                                         run_dir=os.path.join(args.out, name, f"every_{k}")))
        result = row(label, k, run.status, run.error)
        result.notes, result.run_dir = run.notes, run.run_dir
        result.faults_planned = len(base.fault_plan)
        if run.timeline is not None:
            result.faults_fired = len(run.timeline.faults)
        if run.timeline is not None and run.status == "ok":
            _score(result, run.timeline, steady)
        if (run.final_params is not None and ref.final_params is not None
                and ref_steps == base.max_steps):
            result.params_equal, result.params_max_abs_diff = params_equal(
                run.final_params, ref.final_params)
        rows.append(result)
    return rows


def _score(row: Row, timeline: Any, steady_s: float | None) -> None:
    """The row's goodput against its mechanism's reference step time, and against the steady
    step time of the run's own fault-free intervals."""
    row.report = compute_goodput(timeline, steady_step_time_s=steady_s or None)
    row.report_in_run = compute_goodput(timeline, steady_window="run")


def rescore(path: str) -> int:
    """Re-computes every row of an earlier results.json from its recorded timelines."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    references, config, rows = data["references"], data["config"], []
    fields = {f.name for f in dataclasses.fields(Row)} - {"report", "report_in_run"}
    for saved in data["rows"]:
        row = Row(**{k: v for k, v in saved.items() if k in fields})
        timeline = (saved.get("goodput") or {}).get("timeline")
        if timeline is not None and row.status == "ok":
            _score(row, RunTimeline.from_dict(timeline),
                   references.get(row.mechanism, {}).get("steady_step_time_s"))
        rows.append(row)
    plan = config.get("plan", {}).get("faults", [])
    title = (f"recovery benchmark (re-scored {path}): {config.get('model')}, "
             f"{config.get('world_size')} ranks, {config.get('max_steps')} steps, "
             f"{len(plan)} faults")
    print_table(rows, title, console, references)
    out = os.path.dirname(os.path.abspath(path))
    console.log(f"wrote {write_results(out, config, rows, references)}")
    for plot in write_plots(out, rows):
        console.log(f"wrote {plot}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rescore:
        return rescore(args.rescore)
    os.makedirs(args.out, exist_ok=True)
    cfg = PRESETS[args.model]
    data_dir = os.path.join(args.out, "data")
    generate_shards(data_dir, seq_len=min(cfg.max_seq_len, 64), vocab_size=cfg.vocab_size)
    plan = FaultPlan.generate(
        seed=args.fault_seed, fault_count=args.fault_count, after_step=args.fault_after_step,
        max_steps=args.max_steps, world_size=args.world_size,
        kinds=args.fault_kinds.split(","))
    base = Workload(model=args.model, seed=args.seed, lr=args.lr, batch_size=args.batch_size,
                    max_steps=args.max_steps, world_size=args.world_size,
                    checkpoint_interval=max(1, args.max_steps // 4), data_dir=data_dir,
                    run_dir=args.out, fault_plan=plan)
    console.log(f"plan: {[f.id for f in plan]}; output: {args.out}; "
                f"load average {os.getloadavg()[0]:.1f}")
    rows: list[Row] = []
    references: dict[str, dict[str, Any]] = {}
    for name in args.mechanisms:
        rows.extend(bench_mechanism(name, base, args, references))
    title = (f"recovery benchmark: {args.model}, {args.world_size} ranks, {args.max_steps} "
             f"steps, {len(plan)} faults (seed {args.fault_seed}: "
             f"{', '.join(f'{f.kind.value}@{f.step}' for f in plan)})")
    print_table(rows, title, console, references)
    config = dict(vars(args))
    config["plan"] = plan.to_dict()
    # Other users of this machine slow every mechanism alike; say how busy it was.
    config["load_average_at_end"] = os.getloadavg()
    console.log(f"wrote {write_results(args.out, config, rows, references)}")
    for path in write_plots(args.out, rows):
        console.log(f"wrote {path}")
    return 0 if all(r.status in ("ok", "unavailable", "skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
