"""ray_resilience: fault-tolerant PyTorch FSDP training on Ray.

Ray actors host the ranks, a supervisor actor watches and repairs the job, and checkpoints are
written by writer actors without stopping training.

Names are imported on first use (PEP 562): the supervisor and the commit coordinator import
this package without importing torch (seconds per process), the ranks get everything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ray_resilience._internal.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("CheckpointConfig", "LoadedCheckpoint"), "ray_resilience.checkpoint"),
    **dict.fromkeys(("ResilienceConfig", "RunConfig", "ScalingConfig"), "ray_resilience.config"),
    **dict.fromkeys(("CheckpointState", "TrainContext", "get_context", "load_checkpoint", "phase",
                     "report"), "ray_resilience.context"),
    **dict.fromkeys(("ConfigError", "HangError", "InsufficientResourcesError", "ResilienceError",
                     "RestartLimitError", "RunAbortedError", "WorkerDiedError", "WorkerError"),
                    "ray_resilience.errors"),
    **dict.fromkeys(("Fault", "FaultKind", "FaultPlan", "InjectedFault"), "ray_resilience.faults"),
    **dict.fromkeys(("GoodputReport", "RunTimeline", "compute_goodput"), "ray_resilience.goodput"),
    **dict.fromkeys(("Compose", "FaultCounter", "InJobConfig", "InProcessConfig", "MaxAttempts",
                     "NodeExclusion", "NoProgressLimit", "RecoveryState"), "ray_resilience.recovery"),
    "Result": "ray_resilience.result",
    "AdaptiveTimeouts": "ray_resilience.timeouts",
    "ResilientTrainer": "ray_resilience.trainer",
}

__all__ = [
    "AdaptiveTimeouts", "CheckpointConfig", "CheckpointState", "Compose", "compute_goodput",
    "ConfigError", "Fault", "FaultCounter", "FaultKind", "FaultPlan", "get_context",
    "GoodputReport", "HangError", "InjectedFault", "InJobConfig", "InProcessConfig",
    "InsufficientResourcesError", "load_checkpoint", "LoadedCheckpoint", "MaxAttempts",
    "NodeExclusion", "NoProgressLimit", "phase", "RecoveryState", "report", "ResilienceConfig",
    "ResilienceError", "ResilientTrainer", "RestartLimitError", "Result", "RunAbortedError",
    "RunConfig", "RunTimeline", "ScalingConfig", "TrainContext", "WorkerDiedError", "WorkerError",
]


__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)


if TYPE_CHECKING:  # for type checkers and IDEs: the same names, eagerly
    from ray_resilience.checkpoint import CheckpointConfig, LoadedCheckpoint
    from ray_resilience.config import ResilienceConfig, RunConfig, ScalingConfig
    from ray_resilience.context import (
        CheckpointState, TrainContext, get_context, load_checkpoint, phase, report)
    from ray_resilience.errors import (
        ConfigError, HangError, InsufficientResourcesError, ResilienceError, RestartLimitError,
        RunAbortedError, WorkerDiedError, WorkerError)
    from ray_resilience.faults import Fault, FaultKind, FaultPlan, InjectedFault
    from ray_resilience.goodput import GoodputReport, RunTimeline, compute_goodput
    from ray_resilience.recovery import (
        Compose, FaultCounter, InJobConfig, InProcessConfig, MaxAttempts, NodeExclusion,
        NoProgressLimit, RecoveryState)
    from ray_resilience.result import Result
    from ray_resilience.timeouts import AdaptiveTimeouts
    from ray_resilience.trainer import ResilientTrainer
