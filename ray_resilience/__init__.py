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
    Compose, FaultCounter, InJobConfig, InProcessConfig, MaxAttempts, NoProgressLimit,
    RecoveryState)
from ray_resilience.result import Result
from ray_resilience.timeouts import AdaptiveTimeouts
from ray_resilience.trainer import ResilientTrainer

__all__ = [
    "AdaptiveTimeouts", "CheckpointConfig", "LoadedCheckpoint",    "CheckpointState", "Compose", "Fault", "FaultCounter", "FaultKind", "FaultPlan",
    "GoodputReport", "InJobConfig", "InProcessConfig", "InjectedFault", "MaxAttempts",
    "NoProgressLimit", "RecoveryState", "RunTimeline", "compute_goodput", "ConfigError", "HangError", "InsufficientResourcesError",
    "ResilienceConfig", "ResilienceError", "ResilientTrainer", "RestartLimitError", "Result",
    "RunAbortedError", "RunConfig", "ScalingConfig", "TrainContext", "WorkerDiedError",
    "WorkerError", "get_context", "load_checkpoint", "phase", "report",
]
