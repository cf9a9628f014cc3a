"""User-facing configs: one keyword-only dataclass per component, validated on construction
(a bad value raises `ConfigError` naming the field, its value and the fix).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import urllib.parse
from typing import Any

from ray_resilience import _validate as check
from ray_resilience._internal.constants import default_run_name
from ray_resilience.callbacks import Callback
from ray_resilience.checkpoint import CheckpointConfig
from ray_resilience.errors import ConfigError
from ray_resilience.policy.base import RecoveryPolicy
from ray_resilience.restart_config import InJobConfig, InProcessConfig
from ray_resilience.testing.faults import FaultPlan
from ray_resilience.timeouts import AdaptiveTimeouts

DEFAULT_CHECKPOINT_INTERVAL_STEPS = 100
"""`ResilienceConfig.default()`'s storage commit interval (the local tier saves every step)."""
HEARTBEATS_PER_TIMEOUT = 4
"""`InJobConfig.heartbeat_timeout_s` spans at least this many progress intervals."""
_PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
_RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _check_storage_path(path: Any) -> None:
    fix = "give a local/FSx directory or a URI with its bucket, e.g. s3://bucket/prefix."
    if not isinstance(path, str) or not path or path != path.strip():
        raise ConfigError("RunConfig.storage_path", path, fix)
    if "://" in path:
        uri = urllib.parse.urlparse(path)
        if uri.scheme != "file" and not uri.netloc:
            raise ConfigError("RunConfig.storage_path", path, f"names no bucket or host; {fix}")


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
        check.integer("ScalingConfig.num_workers", self.num_workers, minimum=1,
                      fix="One rank per worker actor.")
        check.boolean("ScalingConfig.use_gpu", self.use_gpu)
        check.choice("ScalingConfig.placement_strategy", self.placement_strategy,
                     _PLACEMENT_STRATEGIES)
        if self.resources_per_worker is not None:
            check.number_map("ScalingConfig.resources_per_worker", self.resources_per_worker,
                             minimum=0, fix="Give Ray resource amounts >= 0.")
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
    log_metrics: bool = True
    """Stream every report of every rank to `<run folder>/metrics.jsonl` (the full record)."""
    metrics_history_size: int = 100_000
    """Newest reports `Result.metrics_history` reads back from the metrics log."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _RUN_NAME.fullmatch(self.name):
            raise ConfigError("RunConfig.name", self.name,
                              "use 1-128 characters from letters, digits, '.', '_' and '-', "
                              "starting with a letter or digit (it becomes a folder name).")
        _check_storage_path(self.storage_path)
        if self.storage_filesystem is not None:
            import pyarrow.fs  # noqa: PLC0415 - only when a filesystem is given

            check.instance("RunConfig.storage_filesystem", self.storage_filesystem,
                           pyarrow.fs.FileSystem, optional=True)
        check.boolean("RunConfig.verbose", self.verbose)
        if not isinstance(self.callbacks, (list, tuple)):
            raise ConfigError("RunConfig.callbacks", self.callbacks, "must be a list of Callbacks.")
        for i, callback in enumerate(self.callbacks):
            if not isinstance(callback, Callback):
                raise ConfigError(f"RunConfig.callbacks[{i}]", callback,
                                  "must be an instance of ray_resilience.callbacks.Callback.")
            _check_picklable(f"RunConfig.callbacks[{i}]", callback)
        self.callbacks = list(self.callbacks)
        if not isinstance(self.log_metrics, bool):
            raise ConfigError("RunConfig.log_metrics", self.log_metrics, "must be True or False.")
        if isinstance(self.metrics_history_size, bool) \
                or not isinstance(self.metrics_history_size, int) or self.metrics_history_size < 0:
            raise ConfigError("RunConfig.metrics_history_size", self.metrics_history_size,
                              "must be an integer >= 0 (reports kept in Result.metrics_history).")


@dataclasses.dataclass(kw_only=True)
class ResilienceConfig:
    """How faults are detected and repaired. `ResilienceConfig()` repairs nothing;
    `ResilientTrainer` without `resilience=` uses `ResilienceConfig.default()`."""

    in_process: InProcessConfig | None = None
    """Restart the train function in the same processes (None: off)."""
    in_job: InJobConfig | None = None
    """Replace dead or stuck ranks' actors (None: off)."""
    checkpoint: CheckpointConfig | None = None
    """Async checkpoints through writer actors (None: no checkpoints)."""
    fault_plan: FaultPlan | None = None
    """Faults to inject (tests and benchmarks)."""
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
    adaptive_timeouts: AdaptiveTimeouts | None = None
    """Learn the hang timeouts from the intervals observed (None: fixed)."""
    recovery_policy: RecoveryPolicy | None = None
    """Decides what to do about each fault (None: `DefaultRecoveryPolicy` over the two rungs)."""
    background_imports: str = "auto"
    """When the checkpoint writers import torch's DCP and the prestarted workers import torch:
    "at_start" (beside the ranks' start-up), "after_first_step" (off it; saves requested before
    the writers' import ends are superseded, and a rank lost before the prestarted worker's
    import ends waits for it), or "auto": at start where every node's ranks hold GPUs and leave
    cores idle, else after the first step. `Result.control["background_imports"]` says which."""

    def __post_init__(self) -> None:
        for name, kind, example in _NESTED:
            check.instance(f"ResilienceConfig.{name}", getattr(self, name), kind, optional=True,
                           fix=f"Pass {example}, or None.")
        for name in _TIMEOUTS:
            check.seconds(f"ResilienceConfig.{name}", getattr(self, name))
        check.number_map("ResilienceConfig.phase_timeouts_s", self.phase_timeouts_s, above=0,
                         fix="Map phase names to seconds, e.g. {'validation': 600.0}.")
        check.choice("ResilienceConfig.background_imports", self.background_imports,
                     BACKGROUND_IMPORTS, fix="'auto' decides from each node's cores and GPUs.")
        _check_timing(self)
        _check_timeout_names(self)
        if self.recovery_policy is not None:
            check.instance("ResilienceConfig.recovery_policy", self.recovery_policy,
                           RecoveryPolicy, fix="Subclass ray_resilience.policy.RecoveryPolicy "
                                               "and implement decide, or pass None for the "
                                               "default ladder.")
            _check_picklable("ResilienceConfig.recovery_policy", self.recovery_policy)

    @classmethod
    def disabled(cls, **kwargs: Any) -> ResilienceConfig:
        """No restarts and no checkpoints: the first fault fails the run."""
        return cls(in_process=None, in_job=None, **kwargs)

    @classmethod
    def default(cls, *, checkpoint_interval: int = DEFAULT_CHECKPOINT_INTERVAL_STEPS,
                fault_plan: FaultPlan | None = None, **kwargs: Any) -> ResilienceConfig:
        """Every rung on: in-process restart, respawn, a committed checkpoint every
        `checkpoint_interval` steps (0: none) and the local tier at the interval its measured
        cost allows ("auto")."""
        kwargs.setdefault("in_process", InProcessConfig())
        kwargs.setdefault("in_job", InJobConfig())
        kwargs.setdefault("checkpoint", CheckpointConfig(interval_steps=checkpoint_interval))
        return cls(fault_plan=fault_plan, **kwargs)


BACKGROUND_IMPORTS = ("auto", "at_start", "after_first_step")
"""`ResilienceConfig.background_imports`."""

_NESTED = (("in_process", InProcessConfig, "InProcessConfig(...)"),
           ("in_job", InJobConfig, "InJobConfig(...)"),
           ("checkpoint", CheckpointConfig, "CheckpointConfig(interval_steps=...)"),
           ("fault_plan", FaultPlan, "FaultPlan.explicit([...])"),
           ("adaptive_timeouts", AdaptiveTimeouts, "AdaptiveTimeouts(...)"))
_TIMEOUTS = ("first_step_timeout_s", "step_timeout_s", "progress_interval_s",
             "monitor_interval_s", "process_group_timeout_s", "placement_timeout_s")


def _check_timing(cfg: ResilienceConfig) -> None:
    """Intervals shorter than the timeouts they feed; the supervisor's timeouts shorter than
    torch.distributed's backstop."""
    if cfg.progress_interval_s >= cfg.step_timeout_s:
        raise ConfigError(
            "ResilienceConfig.progress_interval_s", cfg.progress_interval_s,
            f"must be shorter than step_timeout_s={cfg.step_timeout_s}, otherwise every "
            "rank looks hung between two progress reports.")
    if cfg.monitor_interval_s >= cfg.step_timeout_s:
        raise ConfigError("ResilienceConfig.monitor_interval_s", cfg.monitor_interval_s,
                          f"must be shorter than step_timeout_s={cfg.step_timeout_s}.")
    if cfg.step_timeout_s > cfg.first_step_timeout_s:
        raise ConfigError(
            "ResilienceConfig.step_timeout_s", cfg.step_timeout_s,
            f"must be <= first_step_timeout_s={cfg.first_step_timeout_s}: the first step "
            "of an attempt includes model build and checkpoint load.")
    if cfg.process_group_timeout_s <= cfg.step_timeout_s:
        raise ConfigError(
            "ResilienceConfig.process_group_timeout_s", cfg.process_group_timeout_s,
            f"must be longer than step_timeout_s={cfg.step_timeout_s}: the supervisor "
            "must see a hang before torch.distributed times out.")
    heartbeat = cfg.in_job.heartbeat_timeout_s if cfg.in_job is not None else None
    if heartbeat is not None and heartbeat < HEARTBEATS_PER_TIMEOUT * cfg.progress_interval_s:
        raise ConfigError(
            "InJobConfig.heartbeat_timeout_s", heartbeat,
            f"must span at least {HEARTBEATS_PER_TIMEOUT} progress intervals "
            f"(ResilienceConfig.progress_interval_s={cfg.progress_interval_s}): one late "
            "heartbeat would otherwise count as a dead rank. Raise it or send progress more "
            "often.")
    for name, limit in cfg.phase_timeouts_s.items():
        field = f"ResilienceConfig.phase_timeouts_s[{name!r}]"
        if limit <= cfg.progress_interval_s:
            raise ConfigError(field, limit, f"must be longer than progress_interval_s="
                                            f"{cfg.progress_interval_s}.")
        if limit >= cfg.process_group_timeout_s:
            raise ConfigError(field, limit, f"must be shorter than process_group_timeout_s="
                                            f"{cfg.process_group_timeout_s}: peers wait for a "
                                            "rank in this phase inside a collective.")


def _check_timeout_names(cfg: ResilienceConfig) -> None:
    """Phase names that spell a built-in timeout are refused (they would override it
    silently); pinned names must name a timeout that exists."""
    for name in cfg.phase_timeouts_s:
        built_in = name.lower().replace("-", "_").replace(" ", "_")
        if built_in in _BUILT_IN:
            raise ConfigError(f"ResilienceConfig.phase_timeouts_s[{name!r}]", name,
                              f"is the built-in {built_in!r} timeout: set "
                              f"ResilienceConfig.{built_in}_timeout_s instead.")
    if cfg.adaptive_timeouts is None:
        return
    known = (*_BUILT_IN, *cfg.phase_timeouts_s)
    for name in sorted(cfg.adaptive_timeouts.pinned - set(known)):
        near = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise ConfigError("AdaptiveTimeouts.pinned", name,
                          f"names no timeout; {hint}pin one of {sorted(known)} (a phase needs "
                          "an entry in ResilienceConfig.phase_timeouts_s).")


_BUILT_IN = ("step", "first_step")
