"""ray_resilience: fault-tolerant PyTorch FSDP training on Ray.

Ray actors host the ranks, a supervisor actor watches and repairs the job, and checkpoints are
written by writer actors without stopping training.
"""

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

__all__ = [
    "AdaptiveTimeouts", "CheckpointConfig", "CheckpointState", "Compose", "ConfigError", "Fault",
    "FaultCounter", "FaultKind", "FaultPlan", "GoodputReport", "HangError", "InJobConfig",
    "InProcessConfig", "InjectedFault", "InsufficientResourcesError", "LoadedCheckpoint",
    "MaxAttempts", "NoProgressLimit", "NodeExclusion", "RecoveryState", "ResilienceConfig",
    "ResilienceError", "ResilientTrainer", "RestartLimitError", "Result", "RunAbortedError",
    "RunConfig", "RunTimeline", "ScalingConfig", "TrainContext", "WorkerDiedError", "WorkerError",
    "compute_goodput", "get_context", "load_checkpoint", "phase", "report",
]
