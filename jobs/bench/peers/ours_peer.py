"""Ours: `ray_resilience.ResilientTrainer` as a user configures it, in seven variants.

- ours: `ResilienceConfig.default(...)`: in-process restart for exceptions and hangs, failed
  ranks respawned (`InJobConfig(policy="replace-failed")`), async checkpoints through writer
  actors and the node-local tier;
- ours-spare: the same with one warm spare actor (`InJobConfig(num_spares=1)`): one more rank
  slot held idle, charged in infra goodput per slot;
- ours-all: `InJobConfig(policy="all")`: every rank is replaced (what ft_launcher does);
- ours-replica: the defaults plus `CheckpointConfig(memory_replicas=1)`: every writer also holds
  another node's newest committed shards, so the ranks of a lost node restore from a live
  node's memory instead of storage (what a user who fears node loss adds; it doubles the
  memory tier); run where named (`--mechanisms`), not by default;
- ours-disabled: `ResilienceConfig.disabled()` and no checkpoints: the same actors and loop
  with nothing of ours beside them, the fault-free overhead benchmark's floor (no faults);
- ours-nockpt: `ResilienceConfig.default()` with nothing saved (the overhead benchmark gives it
  no checkpoint interval and the local tier off): every recovery rung's machinery running, no
  checkpoint work, which splits ours' fault-free cost between the two;
- ours-nolocal: `ResilienceConfig.default()` with committed checkpoints and the local tier off
  (the overhead benchmark gives it ours' checkpoint interval), which splits the checkpoint
  work's cost between committed saves and the local tier.

The train function is the peers' loop written against our public API: `load_checkpoint` once,
`report(..., checkpoint=CheckpointState)` per step with the RNG state in `extra`. Faults fire
from the benchmark's own loop at the start of the step, before its forward pass, through the
same ledger as every peer (the plan is not given to the supervisor). The timeline is the
supervisor's own, its start moved back to before the private Ray starts (as every peer's clock
starts before its launcher), its faults re-labelled from the ledger (`align_to_ledger`).
The local tier is configured on at every size (`local_max_bytes=None`; the default skips ranks
over 64 MiB) at the interval its measured cost calls for, like every tier of every mechanism.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import torch
from harness.events import EventLog, FaultLedger
from harness.ray_session import rank_resources, ray_for
from harness.spec import PHASES_FILE, PeerRun, Workload
from harness.timeline import align_to_ledger
from harness.workload import (
    FaultTrigger,
    Restored,
    build,
    init_fresh,
    restore,
    write_final_params,
)

import ray_resilience as rr
from ray_resilience.checkpoint import CheckpointConfig
from ray_resilience.examples.llama import causal_lm_loss
from ray_resilience.examples.token_data import TokenDataset
from ray_resilience.goodput import RunTimeline
from ray_resilience.testing import FaultKind

VARIANTS = {"default": {}, "spare": {"num_spares": 1}, "all": {"policy": "all"},
            "replica": {}, "disabled": None, "nockpt": {}, "nolocal": {}}
"""Variant -> `InJobConfig` kwargs; None: `ResilienceConfig.disabled()`, no checkpoints."""
CHECKPOINT_VARIANTS = {"replica": {"memory_replicas": 1}}
"""Variant -> `CheckpointConfig` kwargs beyond the benchmark's intervals."""
#: Longest silence before an attempt's first step (import, model build, checkpoint load); the
#: same as ft_launcher's initial heartbeat timeout.
FIRST_STEP_TIMEOUT_S = 120.0


def _train_loop(config: dict[str, Any]) -> dict[str, int]:
    """Runs on every rank; re-entered from the newest checkpoint after each recovery."""
    t_entry = time.time()
    torch.set_num_threads(1)  # as for every peer: 2 ranks on 2 cores
    workload = Workload.from_json(config["workload"])
    ctx = rr.get_context()
    rank = ctx.world_rank
    log = EventLog(workload.run_dir, f"rank{rank}-pid{os.getpid()}-a{ctx.attempt}")
    log.start(rank, t_entry)  # every peer logs its steps too (the node killer reads them)
    model, optimizer = build(workload)
    log.pg_ready(rank)
    t_load = time.time()
    loaded = rr.load_checkpoint(model=model, optimizer=optimizer)
    if loaded is None:
        init_fresh(workload, model)
    start = restore(workload, rank, None if loaded is None else Restored(
        step=loaded.step, rng=loaded.extra.get("rng"), tier=loaded.tier))
    log.load(rank, t_load, start, tier=None if loaded is None else loaded.tier)
    data = TokenDataset(workload.data_dir)
    faults = FaultTrigger(workload, FaultLedger(workload.run_dir), rank)
    for step in range(start + 1, workload.max_steps + 1):
        faults(step)
        inputs, targets = data.batch(step - 1, rank, ctx.world_size, workload.batch_size)
        loss = causal_lm_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state = rr.CheckpointState(model, optimizer,
                                   extra={"data_step": step, "rng": torch.get_rng_state()})
        rr.report({"loss": loss.item()}, step=step, checkpoint=state)
        log.step(rank, step, loss.item())
        if step in workload.snapshot_steps:
            log.threads(rank, step)
    write_final_params(workload, model, rank)
    return {"final_step": workload.max_steps}


class OursPeer:
    """`ResilientTrainer(...).fit()` with one of VARIANTS."""

    supported_kinds = frozenset({FaultKind.EXCEPTION, FaultKind.SIGKILL, FaultKind.OOM,
                                 FaultKind.HANG, FaultKind.NATIVE_HANG, FaultKind.NODE_LOSS})
    uses_durable = True
    local_tier = True

    def __init__(self, *, variant: str, timeout_s: float = 900.0) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"variant={variant!r} is invalid; use one of {list(VARIANTS)}.")
        self.variant, self.in_job = variant, VARIANTS[variant]
        self.name = "ours" if variant == "default" else f"ours-{variant}"
        self.num_spares = (self.in_job or {}).get("num_spares", 0)
        self.timeout_s = timeout_s  # enforced by the supervisor's own timeouts
        if self.in_job is None:
            self.supported_kinds = frozenset()
            self.uses_durable = self.local_tier = False
            self.config = "ResilienceConfig.disabled: no restarts, no checkpoints"
            return
        self.checkpoint_kwargs = CHECKPOINT_VARIANTS.get(variant, {})
        replicas = self.checkpoint_kwargs.get("memory_replicas", 0)
        self.config = ("ResilienceConfig.default: in-process restart, respawn "
                       f"{self.in_job.get('policy', 'replace-failed')}"
                       + (f", {self.num_spares} warm spare" if self.num_spares else "")
                       + "; step timeout = detection timeout; async checkpoints (coalesce, "
                       "writer actors, memory tier"
                       + (f", {replicas} replica on another node's writer" if replicas else "")
                       + "); local tier to /dev/shm, no size cap")

    def available(self) -> str | None:
        return None

    def run(self, workload: Workload) -> PeerRun:
        workload.write()
        run = PeerRun(mechanism=self.name, run_dir=workload.run_dir,
                      notes=["timeline recorded by our supervisor; faults labelled from the "
                             "benchmark's ledger"])
        t_start = time.time()
        with ray_for(workload, num_cpus=workload.world_size + self.num_spares + 1) as call:
            t_fit = time.time()
            trainer = self._trainer(workload)
            result = call(lambda: trainer.fit(raise_on_failure=False))  # a failure is data here
        _write_phases(workload.run_dir, t_start, t_fit, result.phases,
                      getattr(result, "local_interval_steps", None))
        report = getattr(result, "goodput", None)
        timeline = getattr(report, "timeline", None)
        if timeline is not None:
            timeline, notes = align_to_ledger(_from(timeline, t_start),
                                              FaultLedger(workload.run_dir).records())
            run.timeline = timeline
            run.notes.extend(notes)
        if not result.ok:
            run.status, run.error = "failed", f"{type(result.error).__name__}: {result.error}"
        elif run.timeline is None:
            run.status, run.error = "failed", "Result.goodput carries no timeline"
        return run

    def _trainer(self, workload: Workload) -> Any:
        timeouts = {"step_timeout_s": workload.detect_timeout_s,
                    "first_step_timeout_s": FIRST_STEP_TIMEOUT_S}
        if self.in_job is None:
            resilience = rr.ResilienceConfig.disabled(**timeouts)
        else:
            resilience = rr.ResilienceConfig.default(
                checkpoint=self._checkpoint_config(workload),
                in_job=rr.InJobConfig(**self.in_job), **timeouts)
        return rr.ResilientTrainer(
            _train_loop,
            train_loop_config={"workload": workload.to_json()},
            scaling_config=rr.ScalingConfig(
                num_workers=workload.world_size, resources_per_worker=rank_resources(workload),
                placement_strategy="SPREAD" if workload.nodes else "PACK"),
            run_config=rr.RunConfig(name=f"{self.name}-{int(time.time())}",
                                    storage_path=os.path.join(workload.run_dir, "storage"),
                                    verbose=False),
            resilience=resilience,
        )

    def _checkpoint_config(self, workload: Workload) -> CheckpointConfig:
        return CheckpointConfig(
            interval_steps=workload.checkpoint_interval,
            local_interval_steps=workload.local_interval, local_dir=workload.local_root,
            local_max_bytes=None, **self.checkpoint_kwargs)


def _write_phases(run_dir: str, t_launch: float, t_fit: float, phases: list,
                  local_interval_steps: int | None) -> None:
    """When the run was launched and `fit()` called, the phases our supervisor timed and the
    local tier's interval the run chose (`Result.local_interval_steps`; None: tier off)."""
    with open(os.path.join(run_dir, PHASES_FILE), "w", encoding="utf-8") as f:
        json.dump({"t_launch": t_launch, "t_fit": t_fit, "phases": phases,
                   "local_interval_steps": local_interval_steps}, f)


def _from(timeline: RunTimeline, t_start: float) -> RunTimeline:
    """The supervisor's timeline, made to start when the run began (before the private Ray)."""
    if timeline.t_start is None:
        return timeline
    return RunTimeline.from_dict({**timeline.to_dict(), "t_start": min(timeline.t_start, t_start)})
