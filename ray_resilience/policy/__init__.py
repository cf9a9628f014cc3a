"""Recovery policy: what the supervisor does about a fault, decided from a frozen view of the run.

`RecoveryPolicy` is the interface; `DefaultRecoveryPolicy` is the ladder (in-process restart,
respawn of failed ranks, fail); the parts compose into `InProcessConfig` / `InJobConfig` hooks.
"""

from ray_resilience.policy.parts import Compose, FaultCounter, MaxAttempts, NodeExclusion, NoProgressLimit
from ray_resilience.policy.state import FaultRecord, RecoveryState

__all__ = ["Compose", "FaultCounter", "FaultRecord", "MaxAttempts", "NodeExclusion",
           "NoProgressLimit", "RecoveryState"]
