"""Scores of the checkpoint benchmark: per repetition, then pooled per configuration.

- blocking per save: the slowest rank's (a save holds training until every rank resumes),
  the next optimizer step's wait included;
- AWS efficiency: 1 - sum(blocking) / wall, the AWS/NVRx formula (it cannot see background
  cost);
- throughput efficiency: the no-checkpoint baseline's wall / this wall, same repetition (it
  sees everything a method costs, background writes included);
- persisted fraction: durable checkpoints committed / saves requested;
- staleness: at every step, the age of the newest durable checkpoint (`scoring.staleness`);
- CPU per save: the whole machine's busy CPU-seconds over the timed steps (every process: the
  ranks, ours' writers and coordinator, DCP's checkpoint daemons, Ray) above the no-checkpoint
  run of the same repetition, per save requested. On 2 cores shared by 2 ranks, work done
  beside training takes CPU from it; this says how much each method adds, wherever it runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scoring.staleness import staleness, staleness_summary
from scoring.stats import percentile, summary


def score_rep(result: dict[str, Any], method: str, baseline: dict[str, Any] | None,
              warm_up_saves: int) -> dict[str, Any]:
    """One repetition of a configuration against that repetition's no-checkpoint run
    (`baseline`: its "wall_s" and "machine_cpu_s"; None when it failed)."""
    ranks = result["ranks"]
    first = ranks[0]
    blocking = [max(r["blocking_s"][i] for r in ranks) for i in range(first["requested"])]
    wall = max(r["wall_s"] for r in ranks)
    if method.startswith("ours") and method != "ours_local":
        commits = result.get("commits", [])
        persisted = max(0, result.get("committed", 0) - warm_up_saves)
    else:
        commits = first["commits"]
        persisted = len({s for s, _ in commits})
    ages = staleness(first["step_times"], commits, first["t_start"], base_step=warm_up_saves)
    baseline_wall_s = baseline and baseline["wall_s"]
    machine = first.get("usage", {}).get("machine_cpu_s")
    extra_cpu = (None if machine is None or not baseline or baseline.get("machine_cpu_s") is None
                 or not first["requested"]
                 else (machine - baseline["machine_cpu_s"]) / first["requested"])
    return {"wall_s": wall, "blocking_s": blocking, "requested": first["requested"],
            "persisted": persisted, "ages": ages,
            "aws_efficiency": 1 - sum(blocking) / wall if wall > 0 else None,
            "throughput_efficiency": baseline_wall_s / wall if baseline_wall_s and wall else None,
            "held_mb": (sum(r["held_bytes"] for r in ranks) + result.get("writer_bytes", 0)
                        + result.get("rank_staging_bytes", 0)) / 1e6,
            "cpu_per_save_s": extra_cpu,
            "coalesced": sum(r["coalesced"] for r in ranks),
            "skipped": sum(r["skipped"] for r in ranks), "intake": result.get("intake")}


def pool(reps: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One configuration over its repetitions."""
    blocking = [b for r in reps for b in r["blocking_s"]]
    ages = [a for r in reps for a in r["ages"]]
    fractions = [r["persisted"] / r["requested"] for r in reps if r["requested"]]
    return {
        "reps": len(reps), "requested": summary([r["requested"] for r in reps]),
        "blocking_median_s": percentile(blocking, 50), "blocking_p99_s": percentile(blocking, 99),
        "aws_efficiency": summary([r["aws_efficiency"] for r in reps]),
        "throughput_efficiency": summary([r["throughput_efficiency"] for r in reps]),
        "persisted_fraction": summary(fractions), "staleness": staleness_summary(ages),
        "held_mb": summary([r["held_mb"] for r in reps]),
        "cpu_per_save_s": summary([r.get("cpu_per_save_s") for r in reps]),
        "coalesced_or_skipped": sum(r["coalesced"] + r["skipped"] for r in reps),
        # Ours: how its writers took the snapshots, summed (adopted: the rank's shared slot, no
        # copy; the others copy it).
        **({"intake": {way: sum(r["intake"][way] for r in reps) for way in reps[0]["intake"]}}
           if reps and reps[0].get("intake") else {}),
    }
