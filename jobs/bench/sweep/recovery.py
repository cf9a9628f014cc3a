"""The recovery sweep at one state size: calibrate, measure fault-free, then faulty repetitions.

1. calibration: each mechanism that checkpoints trains fault-free for a third of the run,
   saving durably every few steps and to its local tier (if any) every step, right after the
   same run saving nothing; what a save of each tier costs the run (against its own median
   step, or against that run where it shows more) gives its interval (`scoring.intervals`),
   the same rule for all;
2. reference: each mechanism trains the whole run fault-free at those intervals, `ref_reps`
   times: its steady step (median over the repetitions; the fastest median is the yardstick),
   its overhead against plain torchrun, and the final parameters every faulty run is compared
   with, bit for bit (the first repetition's; the others must equal it too);
3. faulty: each scenario's plan, `reps` times; the order of mechanisms rotates every
   repetition, so a drift of the machine's speed spreads over all of them. Reference
   repetition k runs just before the AWS scenario's repetition k (interleaved, so both see the
   same machine).
Every run is isolated in its own runner process (`sweep.runner`) and charged its resources.
Every finished run goes to the sweep's journal (`sweep.journal`): a sweep stopped by its
deadline or a crash resumes from there, the runs it already has not run again.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from harness import cluster
from harness.sizes import size as size_of
from harness.spec import Workload, unsupported_kinds
from peers import NOT_BIT_COMPARABLE, family, make_peer
from scoring.intervals import save_costs, young_interval
from scoring.yardstick import steady_step_s, yardstick

from ray_resilience.examples.token_data import generate_shards

from . import runs
from .journal import Journal, SweepPaused
from .plans import SCENARIOS, plan_for
from .summary import overhead, summarize_faulty

BASELINE = "torchrun"
FAMILY_REFERENCE = {"fsdp": "torchrun", "replicated": "torchft"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepConfig:
    mechanisms: tuple[str, ...]
    scenarios: tuple[str, ...]
    reps: int
    """Repetitions of the AWS scenario (the headline)."""
    ref_reps: int = 1
    """Repetitions of the fault-free reference run."""
    side_reps: int
    """Repetitions of the other scenarios (detection timeouts and node starts dominate them)."""
    quick: bool
    work_dir: str
    """Scratch folder for run folders (events, logs); not committed."""
    run_timeout_s: float = 1200.0
    world_size: int = 2
    seed: int = 0
    journal: bool = True
    """Keep `<work_dir>/<size>/journal.jsonl` (beside the run folders it refers to)."""
    resume: bool = False
    """Go on with the journal's sweep (same settings) instead of starting one."""
    deadline: float | None = None
    """Wall time (epoch s) after which no new run starts: SweepPaused, resume later."""

    def settings(self, steps: int) -> dict[str, Any]:
        """What a resumed sweep must share with the journal's."""
        return {"mechanisms": list(self.mechanisms), "scenarios": list(self.scenarios),
                "reps": self.reps, "ref_reps": self.ref_reps, "side_reps": self.side_reps,
                "quick": self.quick,
                "work_dir": self.work_dir, "world_size": self.world_size, "seed": self.seed,
                "steps": steps}


def _rotated(names: list[str], by: int) -> list[str]:
    by %= max(1, len(names))
    return names[by:] + names[:by]


class SizeSweep:
    """All phases at one size; `run()` returns the result document (timelines kept apart)."""

    def __init__(self, cfg: SweepConfig, size_name: str, log: Callable[[str], None]) -> None:
        self.cfg, self.size, self.log = cfg, size_of(size_name), log
        self.steps = self.size.quick_steps if cfg.quick else self.size.max_steps
        self.root = os.path.join(cfg.work_dir, self.size.name)
        self.peers = {m: make_peer(m, timeout_s=cfg.run_timeout_s) for m in cfg.mechanisms}
        self.records: list[dict[str, Any]] = []
        self.timelines: dict[str, Any] = {}
        self._count = 0
        self.journal = None if not cfg.journal else Journal(
            os.path.join(self.root, "journal.jsonl"),
            cfg.settings(self.steps), resume=cfg.resume)

    def run(self) -> dict[str, Any]:
        data = os.path.join(self.root, "data")
        generate_shards(data, seq_len=self.size.seq_len, vocab_size=self.size.model.vocab_size)
        base = Workload(size=self.size.name, max_steps=self.steps, world_size=self.cfg.world_size,
                        checkpoint_interval=0, data_dir=data, run_dir=self.root, seed=self.cfg.seed,
                        detect_timeout_s=self.size.detect_timeout_s)
        unavailable = {m: p.available() for m, p in self.peers.items() if p.available()}
        runnable = [m for m in self.cfg.mechanisms if m not in unavailable]
        calibration = self._calibrate(base, runnable)
        intervals = {m: self._intervals(m, calibration.get(m)) for m in runnable}
        references: dict[str, list[dict[str, Any]]] = {m: [] for m in runnable}
        scenarios: dict[str, Any] = {}
        for rep in range(max(self.cfg.ref_reps, self.cfg.reps)):
            if rep < self.cfg.ref_reps:
                for name, record in self._references(base, runnable, intervals, rep).items():
                    references[name].append(record)
            if "aws" in self.cfg.scenarios and rep < self.cfg.reps:
                scenarios["aws"] = self._scenario(base, "aws", runnable, intervals, rep)
        for name in self.cfg.scenarios:
            if name != "aws":
                for rep in range(self.cfg.side_reps):
                    scenarios[name] = self._scenario(base, name, runnable, intervals, rep)
        scenarios = {s: scenarios[s] for s in self.cfg.scenarios}
        steady = {m: _median([r["steady_step_s"] for r in references[m]]) for m in runnable}
        stick = yardstick(steady)
        self._score_all(stick[1] if stick else None, {m: rs[0] for m, rs in references.items()})
        return {
            "size": {**dataclasses.asdict(self.size),
                     "state_bytes_per_rank": self.size.state_bytes_per_rank},
            "max_steps": self.steps, "reps": self.cfg.reps, "ref_reps": self.cfg.ref_reps,
            "side_reps": self.cfg.side_reps,
            "quick": self.cfg.quick,
            "world_size": self.cfg.world_size,
            "yardstick": {"mechanism": stick[0], "step_s": stick[1]} if stick else None,
            "mechanisms": {m: self._describe(m, unavailable.get(m)) for m in self.cfg.mechanisms},
            "calibration": calibration, "intervals": intervals,
            "references": {m: _reference_row(rs, steady[m]) for m, rs in references.items()},
            "overhead_vs_torchrun": overhead(steady, BASELINE),
            "scenarios": {name: self._scenario_doc(name, info)
                          for name, info in scenarios.items()},
        }

    # --- phases ------------------------------------------------------------------------------

    def _calibrate(self, base: Workload, names: list[str]) -> dict[str, Any]:
        steps = max(8, self.steps // 3)
        every = max(2, steps // 4)
        out = {}
        for name in names:
            peer = self.peers[name]
            if not (peer.uses_durable or peer.local_tier):
                continue
            # The same mechanism saving nothing, just before: the step its saves are added to.
            baseline = self._steady_of(self._execute(name, self._workload(
                base, name, "calibration-nosave", max_steps=steps, checkpoint_interval=0,
                local_interval=0), "calibration", 1)) if peer.uses_durable else None
            wl = self._workload(base, name, "calibration", max_steps=steps,
                                checkpoint_interval=every if peer.uses_durable else 0,
                                local_interval=1 if peer.local_tier else 0)
            record = self._execute(name, wl, "calibration", 0)
            timeline = runs.timeline_of(record)
            steady = steady_step_s(timeline) if timeline is not None else None
            durable, local = save_costs(timeline, steady, baseline) if steady else (None, None)
            out[name] = {"status": record["status"], "error": record["error"], "steps": steps,
                         "durable_every": wl.checkpoint_interval, "steady_step_s": steady,
                         "no_save_step_s": baseline,
                         "durable_cost_s": durable, "local_cost_s": local,
                         "usage": record["usage"]}
        return out

    @staticmethod
    def _steady_of(record: dict[str, Any]) -> float | None:
        timeline = runs.timeline_of(record)
        ok = timeline is not None and record["status"] == "ok"
        return steady_step_s(timeline) if ok else None

    def _intervals(self, name: str, cal: dict[str, Any] | None) -> dict[str, Any]:
        peer, faults = self.peers[name], SCENARIOS["aws"][0]
        if not peer.uses_durable and not peer.local_tier:
            return {"durable": 0, "local": 0, "rule": "no checkpoints"}
        steady = (cal or {}).get("steady_step_s")
        if not steady or (peer.uses_durable and (cal or {}).get("durable_cost_s") is None):
            quarter = max(1, self.steps // 4)
            return {"durable": quarter if peer.uses_durable else 0, "local": 0,
                    "rule": "calibration failed: a quarter of the run"}
        durable = young_interval(cal["durable_cost_s"], steady, self.steps, faults) \
            if peer.uses_durable else self.steps
        local = 0
        if peer.local_tier and cal.get("local_cost_s") is not None:
            local = young_interval(cal["local_cost_s"], steady, self.steps, faults)
        against = " against a run without saves" if cal.get("no_save_step_s") else ""
        return {"durable": durable if peer.uses_durable else 0, "local": local,
                "rule": f"Young from measured cost{against}, MTBF = {self.steps}/{faults} steps"}

    def _references(self, base: Workload, names: list[str], intervals: dict[str, Any],
                    rep: int) -> dict[str, dict[str, Any]]:
        out = {}
        for name in _rotated(names, rep):
            wl = self._workload(base, name, "reference" if rep == 0 else f"reference-rep{rep}",
                                checkpoint_interval=intervals[name]["durable"],
                                local_interval=intervals[name]["local"])
            record = self._execute(name, wl, "reference", rep)
            timeline = runs.timeline_of(record)
            record["steady_step_s"] = steady_step_s(timeline) if timeline is not None \
                and record["status"] == "ok" else None
            out[name] = record
        return out

    def _scenario(self, base: Workload, scenario: str, names: list[str],
                  intervals: dict[str, Any], rep: int) -> dict[str, Any]:
        """One repetition of `scenario` (the mechanisms' order rotated by `rep`)."""
        plan = plan_for(scenario, self.steps, self.cfg.world_size)
        skipped = {}
        for name in names:
            missing = unsupported_kinds(self.peers[name], plan)
            if missing:
                reasons = getattr(self.peers[name], "unsupported_reasons", {})
                why = "; ".join(reasons.get(k, "") for k in reasons if k.value in missing)
                skipped[name] = f"cannot recover from {', '.join(missing)}" \
                    + (f": {why}" if why else "")
        active = [n for n in names if n not in skipped]
        for name in _rotated(active, rep + 1):
            nodes = self.cfg.world_size + self.peers[name].num_spares \
                if scenario == "node_loss" else 0
            wl = self._workload(base, name, f"{scenario}-rep{rep}", fault_plan=plan,
                                checkpoint_interval=intervals[name]["durable"],
                                local_interval=intervals[name]["local"], nodes=nodes)
            self._execute(name, wl, scenario, rep)
        return {"plan": plan, "skipped": skipped}

    # --- helpers -----------------------------------------------------------------------------

    def _workload(self, base: Workload, name: str, label: str, **changes: Any) -> Workload:
        self._count += 1
        run_dir = os.path.join(self.root, "runs", f"{self._count:03d}-{name}-{label}")
        local_root = f"/dev/shm/rrbench-{os.getpid()}-{self.size.name}-{self._count:03d}"
        return base.with_(run_dir=run_dir, local_root=local_root, **changes)

    def _execute(self, name: str, wl: Workload, phase: str, rep: int) -> dict[str, Any]:
        key = os.path.basename(wl.run_dir)
        record = self.journal.get(key) if self.journal else None
        if record is not None:
            self.log(f"[{self.size.name}] {key}: from the journal ({record['status']})")
        else:
            if self.cfg.deadline is not None and time.time() >= self.cfg.deadline:
                raise SweepPaused(self.journal.path if self.journal else "(none)",
                                  len(self.records))
            self.log(f"[{self.size.name}] {name}: {phase} run {rep} ({wl.max_steps} steps, "
                     f"durable every {wl.checkpoint_interval}, local every "
                     f"{wl.local_interval}, {len(wl.fault_plan)} faults)")
            record = runs.execute(name, wl, phase=phase, rep=rep,
                                  timeout_s=self.cfg.run_timeout_s)
            self.log(f"    -> {record['status']}"
                     + (f": {record['error']}" if record["error"] else ""))
            if self.journal:
                self.journal.add(key, record)
        self.records.append(record)
        return record

    def sittings(self) -> dict[str, Any]:
        """How the sweep was split over sittings (one unless it was resumed)."""
        if self.journal is None:
            return {}
        return {"sittings": self.journal.summary(),
                "duration_s": round(self.journal.duration_s(), 1)}

    def _score_all(self, stick: float | None, references: dict[str, dict[str, Any]]) -> None:
        ok_ref = {m: r["run_dir"] for m, r in references.items() if r["status"] == "ok"}
        for record in self.records:
            name = record["mechanism"]
            runs.score(record, stick, self.peers[name].num_spares)
            fam = family(name)
            family_ref = ok_ref.get(FAMILY_REFERENCE.get(fam, "")) if fam else None
            first_reference = record["phase"] == "reference" and record["rep"] == 0
            own = None if first_reference else ok_ref.get(name)
            if record["phase"] != "calibration":
                runs.compare(record, own=own, family=family_ref)
            key = f"{record['run_dir'].rsplit('/', 1)[-1]}"
            self.timelines[key] = record.pop("timeline")

    def _scenario_doc(self, scenario: str, info: dict[str, Any]) -> dict[str, Any]:
        faulty = [r for r in self.records if r["phase"] == scenario]
        by_mech = {m: [r for r in faulty if r["mechanism"] == m] for m in self.cfg.mechanisms}
        doc = {"plan": info["plan"].to_dict(), "skipped": info["skipped"],
               "summary": {m: summarize_faulty(rs) for m, rs in by_mech.items() if rs},
               "runs": [_row(r) for r in faulty]}
        if scenario == "node_loss":
            doc["cluster"] = {"description": cluster.DESCRIPTION, "node_object_store_bytes":
                              cluster.node_object_store_bytes(self.cfg.world_size)}
        return doc

    def _describe(self, name: str, unavailable: str | None) -> dict[str, Any]:
        peer = self.peers[name]
        return {"config": peer.config, "unavailable": unavailable, "num_spares": peer.num_spares,
                "family": family(name), "bit_comparable": name not in NOT_BIT_COMPARABLE}


def _median(values: list[float | None]) -> float | None:
    known = sorted(v for v in values if v is not None)
    return statistics.median(known) if known else None


def _reference_row(records: list[dict[str, Any]], steady: float | None) -> dict[str, Any]:
    """The first repetition's row (its final parameters are what the faulty runs are compared
    with), its steady step replaced by the median over the repetitions, which are listed."""
    row = _row(records[0])
    row["steady_step_s"] = steady
    row["repetitions"] = [{"steady_step_s": r["steady_step_s"], "status": r["status"],
                           "params_equal_own": r.get("params_equal_own"),
                           "cpu_s": (r.get("usage") or {}).get("cpu_s")} for r in records]
    return row


def _row(record: dict[str, Any]) -> dict[str, Any]:
    """A run as committed: no run folder path, no timeline."""
    return {k: v for k, v in record.items() if k not in ("run_dir", "timeline")}
