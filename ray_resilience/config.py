"""User-facing configs: one keyword-only dataclass per component, validated on construction
(a bad value raises `ConfigError` naming the field, its value and the fix).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

from ray_resilience._internal.constants import default_run_name
from ray_resilience.callbacks import Callback
from ray_resilience.checkpoint import CheckpointConfig
from ray_resilience.errors import ConfigError
from ray_resilience.policy.base import RecoveryPolicy
from ray_resilience.policy.parts import Compose, FaultCounter, MaxAttempts, NoProgressLimit
from ray_resilience.policy.state import RecoveryState

_PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def _positive(field: str, value: float, *, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(field, value, f"must be {bound}.")


def _check_picklable(field: str, value: object) -> None:
    """It travels to the supervisor actor: fail here, not in Ray's actor creation."""
    from ray import cloudpickle  # noqa: PLC0415 - ray loads only when a callback or policy is set

    try:
        cloudpickle.dumps(value)
    except Exception as exc:  # noqa: BLE001 - any pickling failure means the same fix
        raise ConfigError(field, value, f"must be picklable (it runs in the supervisor actor): "
                                        f"{type(exc).__name__}: {exc}. Keep locks, sockets and "
                                        "open files out of it, or create them lazily.") from None


@dataclasses.dataclass(kw_only=True)
class ScalingConfig:
    """How many ranks and what each one gets. One rank per actor, one actor per bundle."""

    num_workers: int = 1
    """Number of ranks (world size)."""
    use_gpu: bool = False
    """One GPU per rank and the NCCL backend; otherwise CPU and gloo."""
    resources_per_worker: dict[str, float] | None = None
    """Ray resources per rank; default {"CPU": 1} (plus {"GPU": 1} with use_gpu)."""
    placement_strategy: str = "PACK"
    """Placement group strategy for the ranks' bundles."""

    def __post_init__(self) -> None:
        if not isinstance(self.num_workers, int) or self.num_workers < 1:
            raise ConfigError("ScalingConfig.num_workers", self.num_workers,
                              "must be an integer >= 1 (one rank per worker actor).")
        if self.placement_strategy not in _PLACEMENT_STRATEGIES:
            raise ConfigError("ScalingConfig.placement_strategy", self.placement_strategy,
                              f"must be one of {_PLACEMENT_STRATEGIES}.")
        for name, amount in (self.resources_per_worker or {}).items():
            if not isinstance(amount, (int, float)) or amount < 0:
                raise ConfigError(f"ScalingConfig.resources_per_worker[{name!r}]", amount,
                                  "must be a number >= 0.")
        gpus = (self.resources_per_worker or {}).get("GPU", 0)
        if gpus and not self.use_gpu:
            raise ConfigError("ScalingConfig.resources_per_worker['GPU']", gpus,
                              "set use_gpu=True to give ranks GPUs (and the NCCL backend).")

    @property
    def bundle(self) -> dict[str, float]:
        """The placement-group bundle of one rank."""
        bundle: dict[str, float] = {"CPU": 1.0}
        if self.use_gpu:
            bundle["GPU"] = 1.0
        bundle.update({k: float(v) for k, v in (self.resources_per_worker or {}).items()})
        return {k: v for k, v in bundle.items() if v > 0}

    @property
    def backend(self) -> str:
        return "nccl" if self.use_gpu else "gloo"


@dataclasses.dataclass(kw_only=True)
class RunConfig:
    """Where a run lives. The run folder is `<storage_path>/<name>`; the same name resumes."""

    name: str = dataclasses.field(default_factory=default_run_name)
    """Run name; default `ray_resilience_run-<YYYYmmdd-HHMMSS>-<4 hex>`, new for every run. Give
    a name to resume: a job with the name of an earlier run resumes from its last committed
    checkpoint (a job whose run is still held by another fails, see `lease_wait_s`)."""
    storage_path: str = dataclasses.field(
        default_factory=lambda: os.path.expanduser("~/ray_results"))
    """Local/FSx path or s3://bucket/prefix (add ?endpoint_override=host:port for S3-compatible)."""
    storage_filesystem: Any = None
    """Optional pyarrow.fs.FileSystem to use for storage_path (as in Ray Train)."""
    verbose: bool = True
    """Show live progress and a summary on the driver."""
    callbacks: list[Callback] = dataclasses.field(default_factory=list)
    """`ray_resilience.callbacks.Callback`s run in the supervisor actor on run events."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _RUN_NAME.match(self.name):
            raise ConfigError("RunConfig.name", self.name,
                              "use 1-128 characters from letters, digits, '.', '_' and '-', "
                              "starting with a letter or digit (it becomes a folder name).")
        if not isinstance(self.storage_path, str) or not self.storage_path:
            raise ConfigError("RunConfig.storage_path", self.storage_path,
                              "give a local/FSx directory or an s3://bucket/prefix URI.")
        if not isinstance(self.callbacks, (list, tuple)):
            raise ConfigError("RunConfig.callbacks", self.callbacks, "must be a list of Callbacks.")
        for i, callback in enumerate(self.callbacks):
            if not isinstance(callback, Callback):
                raise ConfigError(f"RunConfig.callbacks[{i}]", callback,
                                  "must be an instance of ray_resilience.callbacks.Callback.")
            _check_picklable(f"RunConfig.callbacks[{i}]", callback)
        self.callbacks = list(self.callbacks)


@dataclasses.dataclass(kw_only=True)
class ResilienceConfig:
    """How faults are detected and repaired; the default repairs nothing."""

    in_process: Any = None
    """InProcessConfig: restart the train function in the same processes (None: off)."""
    in_job: Any = None
    """InJobConfig: replace dead or stuck ranks' actors (None: off)."""
    checkpoint: Any = None
    """CheckpointConfig: async checkpoints through writer actors (None: no checkpoints)."""
    fault_plan: Any = None
    """FaultPlan: faults to inject (tests and benchmarks)."""
    first_step_timeout_s: float = 600.0
    """Longest silence before the first step of an attempt (model build, checkpoint load)."""
    step_timeout_s: float = 120.0
    """Longest silence allowed between two steps once training runs."""
    progress_interval_s: float = 0.25
    """How often each rank's side thread forwards progress to the supervisor."""
    monitor_interval_s: float = 0.05
    """How often the supervisor wakes to check heartbeats when nothing else happens."""
    process_group_timeout_s: float = 1800.0
    """torch.distributed timeout: the backstop when nothing else unblocks a collective."""
    placement_timeout_s: float = 120.0
    """How long to wait for the placement group before failing with the resources missing."""
    phase_timeouts_s: dict[str, float] = dataclasses.field(default_factory=dict)
    """Silence allowed inside a user-marked phase (`with ray_resilience.phase("validation")`)."""
    adaptive_timeouts: Any = None
    """AdaptiveTimeouts: learn the hang timeouts from the intervals observed (None: fixed)."""
    recovery_policy: RecoveryPolicy | None = None
    """Decides what to do about each fault (None: `DefaultRecoveryPolicy` over the two rungs)."""

    def __post_init__(self) -> None:
        for name in ("first_step_timeout_s", "step_timeout_s", "progress_interval_s",
                     "monitor_interval_s", "process_group_timeout_s", "placement_timeout_s"):
            _positive(f"ResilienceConfig.{name}", getattr(self, name))
        for name, value in self.phase_timeouts_s.items():
            _positive(f"ResilienceConfig.phase_timeouts_s[{name!r}]", value)
        if self.progress_interval_s >= self.step_timeout_s:
            raise ConfigError(
                "ResilienceConfig.progress_interval_s", self.progress_interval_s,
                f"must be shorter than step_timeout_s={self.step_timeout_s}, otherwise every "
                "rank looks hung between two progress reports.")
        if self.step_timeout_s > self.first_step_timeout_s:
            raise ConfigError(
                "ResilienceConfig.step_timeout_s", self.step_timeout_s,
                f"must be <= first_step_timeout_s={self.first_step_timeout_s}: the first step "
                "of an attempt includes model build and checkpoint load.")
        if self.process_group_timeout_s <= self.step_timeout_s:
            raise ConfigError(
                "ResilienceConfig.process_group_timeout_s", self.process_group_timeout_s,
                f"must be longer than step_timeout_s={self.step_timeout_s}: the supervisor "
                "must see a hang before torch.distributed times out.")
        if self.recovery_policy is not None:
            if not isinstance(self.recovery_policy, RecoveryPolicy):
                raise ConfigError("ResilienceConfig.recovery_policy", self.recovery_policy,
                                  "must be a ray_resilience.policy.RecoveryPolicy (subclass it and "
                                  "implement decide), or None for the default ladder.")
            _check_picklable("ResilienceConfig.recovery_policy", self.recovery_policy)

    @classmethod
    def disabled(cls, **kwargs: Any) -> ResilienceConfig:
        """No restarts: the first fault fails the run."""
        return cls(in_process=None, in_job=None, **kwargs)

    @classmethod
    def default(cls, *, checkpoint_interval: int = 0, fault_plan: Any = None,
                **kwargs: Any) -> ResilienceConfig:
        """Every rung on: in-process restart, respawn, a committed checkpoint every
        `checkpoint_interval` steps (0: none) and the local tier at every step."""
        kwargs.setdefault("in_process", InProcessConfig())
        kwargs.setdefault("in_job", InJobConfig())
        kwargs.setdefault("checkpoint", CheckpointConfig(interval_steps=checkpoint_interval))
        return cls(fault_plan=fault_plan, **kwargs)


def _check(field: str, value: Any, minimum: float, fix: str, *, integer: bool = False) -> None:
    bad_type = isinstance(value, bool) or not isinstance(value, int if integer else (int, float))
    if bad_type or value < minimum:
        raise ConfigError(field, value, fix)


@dataclasses.dataclass(kw_only=True)
class InProcessConfig:
    """Rung 1: on an exception or a Python-level hang, every rank keeps its process and the
    train function is re-entered from the newest checkpoint."""

    max_restarts: int = 20
    """In-process restarts allowed in one run."""
    max_attempts_without_progress: int = 3
    """Stop when this many attempts in a row complete no new step (restart storm)."""
    interrupt_timeout_s: float = 10.0
    """Hard timeout: how long an interrupted rank may take to unwind before it is respawned."""
    barrier_timeout_s: float = 60.0
    """How long the new attempt's rendezvous may take."""
    health_check: Callable[[RecoveryState], Sequence[int]] = dataclasses.field(
        default_factory=lambda: Compose(FaultCounter()))
    """Ranks that must not keep their process (they are respawned when InJobConfig allows)."""
    retry_limit: Callable[[RecoveryState], Sequence[tuple[str, int]]] | None = None
    """Reasons to stop; default: MaxAttempts(max_restarts) + NoProgressLimit(...)."""

    def __post_init__(self) -> None:
        _check("InProcessConfig.max_restarts", self.max_restarts, 0,
               "must be an integer >= 0 (0 turns in-process restart off).", integer=True)
        _check("InProcessConfig.max_attempts_without_progress", self.max_attempts_without_progress,
               1, "must be an integer >= 1.", integer=True)
        _check("InProcessConfig.interrupt_timeout_s", self.interrupt_timeout_s, 0.1,
               "must be >= 0.1 s: ranks need time to unwind after an abort.")
        _check("InProcessConfig.barrier_timeout_s", self.barrier_timeout_s, 1.0, "must be >= 1 s.")
        if self.retry_limit is None:
            self.retry_limit = Compose(
                MaxAttempts(self.max_restarts),
                NoProgressLimit(self.max_attempts_without_progress))


RESPAWN_POLICIES = ("replace-failed", "all")


@dataclasses.dataclass(kw_only=True)
class InJobConfig:
    """Rung 2: dead or stuck ranks get new actors in the same placement group;
    `replace-failed` replaces only them, `all` every rank."""

    policy: str = "replace-failed"
    """"replace-failed" | "all"."""
    max_restarts: int = 10
    """Respawns allowed in one run."""
    max_attempts_without_progress: int = 3
    """Stop when this many respawns in a row complete no new step."""
    num_spares: int = 0
    """Warm spare actors started ahead of time; a replacement then skips process start-up."""
    num_prestarted_workers: int = 1
    """Ray worker processes kept booted (and importing torch at idle priority) on each node
    hosting ranks, for respawns without a spare; about 0.4 GB each. 0: off."""
    heartbeat_timeout_s: float = 10.0
    """A rank whose side thread sent nothing for this long is dead (frozen, node lost)."""
    replacement_timeout_s: float = 300.0
    """How long to wait for capacity for a replacement."""
    min_workers: int | None = None
    """Continue with fewer ranks (down to this many) when replacements find no capacity
    in time; the checkpoint is loaded resharded. None: never shrink."""
    max_node_faults: int | None = None
    """Exclude a node after more than this many faults lost or hung a rank's process on it;
    its ranks move elsewhere. None: never."""

    def __post_init__(self) -> None:
        if self.policy not in RESPAWN_POLICIES:
            raise ConfigError("InJobConfig.policy", self.policy,
                              f"must be one of {RESPAWN_POLICIES}.")
        _check("InJobConfig.max_restarts", self.max_restarts, 0, "must be an integer >= 0.",
               integer=True)
        _check("InJobConfig.max_attempts_without_progress", self.max_attempts_without_progress, 1,
               "must be an integer >= 1.", integer=True)
        _check("InJobConfig.num_spares", self.num_spares, 0, "must be an integer >= 0.",
               integer=True)
        _check("InJobConfig.num_prestarted_workers", self.num_prestarted_workers, 0,
               "must be an integer >= 0 (0: no prestarted worker processes).", integer=True)
        _check("InJobConfig.heartbeat_timeout_s", self.heartbeat_timeout_s, 0.5,
               "must be >= 0.5 s (several progress intervals).")
        _check("InJobConfig.replacement_timeout_s", self.replacement_timeout_s, 1.0,
               "must be >= 1 s.")
        if self.min_workers is not None:
            _check("InJobConfig.min_workers", self.min_workers, 1,
                   "must be an integer >= 1, or None to never shrink the world.", integer=True)
        if self.max_node_faults is not None:
            _check("InJobConfig.max_node_faults", self.max_node_faults, 1,
                   "must be an integer >= 1 (faults a node may host before it is excluded), "
                   "or None to never exclude nodes.", integer=True)
