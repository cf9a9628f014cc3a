"""The fault scenarios of the recovery sweep, scaled to a run of any length.

- aws: the AWS/NVRx fault-recovery test case's generator (seed 42, 5 faults, exception and
  SIGKILL, never rank 0), its first allowed step scaled from their 10 of 2000;
- hang: the same generator with 2 Python-level hangs (a rank stops stepping; only a timeout
  notices);
- node_loss: the same generator with 2 node losses, run in a simulated multi-node cluster
  (`harness/cluster.py`) by the mechanisms that can run there.
Both are drawn with `FaultPlan.generate`, so a plan is reproducible from its arguments.
"""

from __future__ import annotations

from ray_resilience.testing import FaultPlan

SCENARIOS = {"aws": (5, ("exception", "sigkill")), "hang": (2, ("hang",)),
             "node_loss": (2, ("node_loss",))}
SEED = 42


def plan_for(scenario: str, max_steps: int, world_size: int) -> FaultPlan:
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario={scenario!r} is unknown; choose from {', '.join(SCENARIOS)}.")
    count, kinds = SCENARIOS[scenario]
    return FaultPlan.generate(seed=SEED, fault_count=count, after_step=max(3, max_steps // 200),
                              max_steps=max_steps, world_size=world_size, kinds=list(kinds))
