"""ray_resilience: fault-tolerant PyTorch FSDP training on Ray.

Names are imported on first use (PEP 562), so control-plane actors import no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ray_resilience._internal.lazy import lazy_exports

_EXPORTS: dict[str, str] = {
    "ResilientTrainer": "ray_resilience.trainer",
    **dict.fromkeys(("InJobConfig", "InProcessConfig", "ResilienceConfig", "RunConfig",
                     "ScalingConfig"), "ray_resilience.config"),
    "CheckpointConfig": "ray_resilience.checkpoint.config",
    "AdaptiveTimeouts": "ray_resilience.timeouts",
    **dict.fromkeys(("CheckpointState", "TrainContext", "get_context", "get_dataset_shard",
                     "load_checkpoint", "phase", "report"), "ray_resilience.context"),
    "Result": "ray_resilience.result",
    **dict.fromkeys(("ConfigError", "ResilienceError"), "ray_resilience.errors"),
}

__all__ = sorted(_EXPORTS, key=str.lower)

__getattr__, __dir__ = lazy_exports(__name__, globals(), _EXPORTS)


if TYPE_CHECKING:  # the same names, eagerly, for type checkers and IDEs
    from ray_resilience.checkpoint.config import CheckpointConfig as CheckpointConfig
    from ray_resilience.config import InJobConfig as InJobConfig
    from ray_resilience.config import InProcessConfig as InProcessConfig
    from ray_resilience.config import ResilienceConfig as ResilienceConfig
    from ray_resilience.config import RunConfig as RunConfig
    from ray_resilience.config import ScalingConfig as ScalingConfig
    from ray_resilience.context import CheckpointState as CheckpointState
    from ray_resilience.context import TrainContext as TrainContext
    from ray_resilience.context import get_context as get_context
    from ray_resilience.context import get_dataset_shard as get_dataset_shard
    from ray_resilience.context import load_checkpoint as load_checkpoint
    from ray_resilience.context import phase as phase
    from ray_resilience.context import report as report
    from ray_resilience.errors import ConfigError as ConfigError
    from ray_resilience.errors import ResilienceError as ResilienceError
    from ray_resilience.result import Result as Result
    from ray_resilience.timeouts import AdaptiveTimeouts as AdaptiveTimeouts
    from ray_resilience.trainer import ResilientTrainer as ResilientTrainer
