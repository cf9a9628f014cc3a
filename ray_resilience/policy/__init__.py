"""Recovery policy: what the supervisor does about a fault, decided from a frozen view of the run.

`RecoveryPolicy` is the interface (`decide(fault, state) -> Decision`); `DefaultRecoveryPolicy`
is the ladder (in-process restart, respawn of failed ranks, fail); the parts compose into
`InProcessConfig` / `InJobConfig` hooks.
"""

from ray_resilience.policy.base import Action, Decision, RecoveryPolicy
from ray_resilience.policy.ladder import DefaultRecoveryPolicy
from ray_resilience.policy.parts import (
    Compose,
    FaultCounter,
    MaxAttempts,
    NodeExclusion,
    NoProgressLimit,
)
from ray_resilience.policy.state import FaultCause, FaultRecord, RecoveryState

__all__ = ["Action", "Compose", "Decision", "DefaultRecoveryPolicy", "FaultCause", "FaultCounter",
           "FaultRecord", "MaxAttempts", "NodeExclusion", "NoProgressLimit", "RecoveryPolicy",
           "RecoveryState"]
