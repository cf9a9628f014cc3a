"""Our mechanisms: `ray_resilience.ResilientTrainer` in three recovery configurations.

- ours-inprocess: `ResilienceConfig.default(...)`, the whole ladder as users get it: ranks keep
  their processes, the train function is re-entered and resumes from the newest checkpoint
  (the default also carries `InJobConfig()` for ranks that died, so today this is the same
  configuration as ours-replace-failed);
- ours-replace-failed: plus `InJobConfig(policy="replace-failed")`: dead or stuck ranks get
  new actors, survivors restart in-process;
- ours-replace-failed-spare: the same with one warm spare actor (`InJobConfig(num_spares=1)`,
  one more bundle of resources): a replacement skips process start-up;
- ours-replace-failed-2spares: two warm spares (two more bundles): a second fault that comes
  before the first spare's replacement is warm (4-5 s here) still finds one;
- ours-all: plus `InJobConfig(policy="all")`: every rank is replaced (ft_launcher behaviour).

The train function is the same loop as the peers' (`workload.build`, same data and steps) written
against our public API: `load_checkpoint` once, `report(..., checkpoint=CheckpointState)` per
step, which checkpoints every `checkpoint_interval` steps without blocking. Faults come from the
`FaultPlan` in the `ResilienceConfig` (the supervisor fires each once). The timeline is the
supervisor's own (`result.goodput`), recorded on `time.time()` like the peers'; its start is moved
back to the `fit()` call so startup counts the same way for every mechanism.

Lead's part: `ResilienceConfig.default`, `InJobConfig` and `Result.goodput` come from the
supervisor work in progress. When they are missing the run reports "unavailable" with the reason,
never numbers.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from ray_resilience.goodput import RunTimeline
from ray_resilience.policy import Compose
from ray_resilience.testing import FaultKind

from .ray_session import private_ray
from .spec import PeerRun, Workload
from .workload import build, read_final_params, write_final_params

VARIANTS = ("inprocess", "replace-failed", "replace-failed-spare", "replace-failed-2spares", "all")
SPARES = {"replace-failed-spare": 1, "replace-failed-2spares": 2}


def _train_loop(config: dict[str, Any]) -> dict[str, int]:
    """Runs on every rank; re-entered from the newest checkpoint after each recovery."""
    import ray_resilience as rr  # noqa: PLC0415 - runs on the rank
    from ray_resilience.examples.llama import causal_lm_loss  # noqa: PLC0415 - runs on the rank
    from ray_resilience.examples.token_data import TokenDataset  # noqa: PLC0415 - runs on the rank

    torch.set_num_threads(1)  # as for every peer: 2 ranks on 2 cores
    workload = Workload.from_json(config["workload"])
    ctx = rr.get_context()
    model, optimizer = build(workload)
    data = TokenDataset(workload.data_dir)
    loaded = rr.load_checkpoint(model=model, optimizer=optimizer)
    start = loaded.step if loaded is not None else 0
    for step in range(start + 1, workload.max_steps + 1):
        inputs, targets = data.batch(step - 1, ctx.world_rank, ctx.world_size,
                                     workload.batch_size)
        loss = causal_lm_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        rr.report({"loss": loss.item()}, step=step,
                  checkpoint=rr.CheckpointState(model, optimizer, extra={"data_step": step}))
    write_final_params(workload, model, ctx.world_rank)
    return {"final_step": workload.max_steps}


def _from_launch(timeline: RunTimeline | None, t_launch: float) -> RunTimeline | None:
    """The supervisor's timeline, made to start when `fit()` was called, as every peer's does
    (its own start is when the supervisor got going, after `fit()` created it). Both clocks are
    `time.time()` on this machine."""
    if timeline is None or timeline.t_start is None:
        return timeline
    return RunTimeline.from_dict({**timeline.to_dict(), "t_start": min(timeline.t_start, t_launch)})


class OursPeer:
    """`ResilientTrainer(...).fit()` with one of VARIANTS."""

    supported_kinds = frozenset({FaultKind.EXCEPTION, FaultKind.SIGKILL, FaultKind.OOM,
                                 FaultKind.HANG, FaultKind.NATIVE_HANG})
    local_restore_kinds = supported_kinds
    """All of them keep the node (and its /dev/shm): the default `CheckpointConfig` writes the
    local tier at every step, so ranks resume from the newest step all of them finished."""

    def __init__(self, *, variant: str, timeout_s: float = 900.0) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"variant={variant!r} is invalid; use one of {VARIANTS}.")
        self.variant = variant
        self.name = f"ours-{variant}"
        self.timeout_s = timeout_s  # enforced by the supervisor's own timeouts, not here

    def available(self) -> str | None:
        """Why our mechanism cannot run yet (the lead's API is still landing), else None."""
        try:
            import ray_resilience as rr  # noqa: PLC0415 - the probe: ImportError is the answer

            rr.ResilienceConfig.default  # noqa: B018 - presence check
            if self.variant != "inprocess":
                rr.InJobConfig  # noqa: B018 - presence check
        except (ImportError, AttributeError) as exc:
            return f"not available yet (supervisor API in progress): {type(exc).__name__}: {exc}"
        return None

    def run(self, workload: Workload) -> PeerRun:
        import ray_resilience as rr  # noqa: PLC0415 - checked by available() first

        workload.write()
        run = PeerRun(mechanism=self.name, checkpoint_interval=workload.checkpoint_interval,
                      faulty=len(workload.fault_plan) > 0, run_dir=workload.run_dir,
                      notes=[("timeline recorded by our supervisor (detect/teardown/"
                              "rendezvous/load phases as it reports them)")])
        with private_ray():
            t_launch = time.time()
            result = self._trainer(rr, workload).fit()
        report = getattr(result, "goodput", None)
        run.timeline = _from_launch(getattr(report, "timeline", None), t_launch)
        run.final_params = read_final_params(workload.run_dir)
        if not result.ok:
            run.status, run.error = "failed", f"{type(result.error).__name__}: {result.error}"
        elif run.timeline is None:
            run.status = "unavailable"
            run.error = ("not available yet: Result.goodput (GoodputReport with its timeline) "
                         "is None")
        elif run.final_params is None:
            run.status, run.error = "failed", "rank 0 never wrote the final parameters"
        return run

    def _trainer(self, rr: Any, workload: Workload) -> Any:
        kwargs: dict[str, Any] = {"checkpoint_interval": workload.checkpoint_interval,
                                  "fault_plan": workload.fault_plan}
        if self.variant in SPARES:
            kwargs["in_job"] = rr.InJobConfig(policy="replace-failed",
                                              num_spares=SPARES[self.variant])
        elif self.variant != "inprocess":
            kwargs["in_job"] = rr.InJobConfig(policy=self.variant)
        else:  # rung 1 alone for soft faults: no fault counter sending a rank to respawn
            kwargs["in_process"] = rr.InProcessConfig(health_check=Compose())
        return rr.ResilientTrainer(
            _train_loop,
            train_loop_config={"workload": workload.to_json()},
            scaling_config=rr.ScalingConfig(num_workers=workload.world_size),
            run_config=rr.RunConfig(name=f"{self.name}-{int(time.time())}",
                                    storage_path=os.path.join(workload.run_dir, "storage"),
                                    verbose=False),
            resilience=rr.ResilienceConfig.default(**kwargs),
        )
