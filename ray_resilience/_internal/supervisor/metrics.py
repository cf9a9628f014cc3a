"""Run metrics exported through Ray's metrics API, for the Ray dashboard and Prometheus.

`MetricsCallback` feeds one `RunMetrics` per run from the supervisor's event stream; all
metrics carry the tag `run` (the run name). Ray exports them from the supervisor's process;
Prometheus sees each name with Ray's `ray_` prefix (counters also with `_total`, histograms as
`_bucket`/`_sum`/`_count`), see `prometheus_names`.

Metrics never fail a run: without a connected Ray (unit tests, plain Python), with
`enabled=False`, or when recording raises, every call is a no-op (the first error is logged).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ray
from ray.util import metrics as ray_metrics

from ray_resilience.callbacks import (
    Callback,
    CheckpointCommitted,
    CheckpointDropped,
    CheckpointSaved,
    RecoveryDone,
    RunEnded,
    StepCompleted,
)

if TYPE_CHECKING:
    from ray_resilience.goodput import GoodputReport

logger = logging.getLogger(__name__)

_RECOVERY_BUCKETS_S = [0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800]
_LATENCY_BUCKETS_S = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300]
_STEP_BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000]


@dataclasses.dataclass(frozen=True, kw_only=True)
class MetricSpec:
    """One exported metric: Ray metric type, name, help text, tags beyond `run`, buckets."""

    kind: str  # "counter" | "gauge" | "histogram"
    name: str
    description: str
    tag_keys: tuple[str, ...] = ()
    boundaries: tuple[float, ...] = ()


METRIC_SPECS: tuple[MetricSpec, ...] = (
    MetricSpec(kind="counter", name="ray_resilience_restarts",
               description="Recoveries performed, by restart cause and recovery mechanism.",
               tag_keys=("cause", "mechanism", "rank")),
    MetricSpec(kind="histogram", name="ray_resilience_recovery_time_s",
               description="Seconds from a fault to the first completed step after it.",
               tag_keys=("cause", "mechanism"), boundaries=tuple(_RECOVERY_BUCKETS_S)),
    MetricSpec(kind="histogram", name="ray_resilience_rollback_steps",
               description="Steps redone after a fault (fault step minus resumed checkpoint).",
               tag_keys=("cause", "mechanism"), boundaries=tuple(_STEP_BUCKETS)),
    MetricSpec(kind="histogram", name="ray_resilience_checkpoint_save_latency_s",
               description="Seconds from a checkpoint save call until it is committed.",
               boundaries=tuple(_LATENCY_BUCKETS_S)),
    MetricSpec(kind="histogram", name="ray_resilience_checkpoint_blocking_s",
               description="Seconds a save blocked the training thread (max over ranks).",
               boundaries=tuple(_LATENCY_BUCKETS_S)),
    MetricSpec(kind="counter", name="ray_resilience_checkpoint_dropped",
               description="Checkpoint saves asked for and never committed, by why (torn, "
                           "skipped, coalesced, failed, restart, fenced, not_committed).",
               tag_keys=("kind",)),
    MetricSpec(kind="gauge", name="ray_resilience_checkpoint_age_s",
               description="Seconds since the newest committed checkpoint."),
    MetricSpec(kind="gauge", name="ray_resilience_training_goodput",
               description="Training goodput of the run so far (fraction, 0..1)."),
    MetricSpec(kind="gauge", name="ray_resilience_infra_goodput",
               description="Infra goodput of the run so far (fraction, 0..1)."),
    MetricSpec(kind="gauge", name="ray_resilience_completed_step",
               description="Newest completed global training step."),
)

#: Names as registered with `ray.util.metrics` (Prometheus adds "ray_" in front, see above).
EXPORTED_METRICS: tuple[str, ...] = tuple(spec.name for spec in METRIC_SPECS)


def prometheus_names() -> dict[str, tuple[str, ...]]:
    """Series names a Prometheus scrape of Ray shows for each exported metric."""
    suffixes = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
    return {s.name: tuple(f"ray_{s.name}{x}" for x in suffixes[s.kind]) for s in METRIC_SPECS}


class RunMetrics:
    """The supervisor's handle on one run's exported metrics. Cheap to call on every event."""

    def __init__(
        self, run_name: str, *, enabled: bool = True, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.run_name = run_name
        self._clock = clock
        self._last_commit_at: float | None = None
        self._failed = False
        self._metrics: dict[str, Any] = {}
        if enabled and _ray_connected():
            try:
                self._metrics = _create(run_name)
            except Exception:  # metrics are best effort; the run goes on
                logger.warning("could not create the metrics of run %s; not exporting them",
                               run_name, exc_info=True)

    @property
    def active(self) -> bool:
        """True when values are really exported (Ray connected, enabled, no recording error)."""
        return bool(self._metrics) and not self._failed

    def on_step(self, step: int) -> None:
        """A new global step completed; also refreshes the checkpoint age."""
        self._record("ray_resilience_completed_step", "set", float(step))
        if self._last_commit_at is not None:
            age = self._clock() - self._last_commit_at
            self._record("ray_resilience_checkpoint_age_s", "set", age)

    def on_checkpoint(
        self, step: int, *, save_latency_s: float | None = None, blocking_s: float | None = None,
        committed: bool = True,
    ) -> None:
        """A checkpoint of `step` was saved (blocking_s) and/or committed (save_latency_s)."""
        if blocking_s is not None:
            self._record("ray_resilience_checkpoint_blocking_s", "observe", blocking_s)
        if save_latency_s is not None:
            self._record("ray_resilience_checkpoint_save_latency_s", "observe", save_latency_s)
        if committed:
            self._last_commit_at = self._clock()
            self._record("ray_resilience_checkpoint_age_s", "set", 0.0)

    def on_dropped(self, kind: str) -> None:
        """A requested checkpoint save will never be committed."""
        self._record("ray_resilience_checkpoint_dropped", "inc", 1.0, {"kind": kind})

    def on_restart(
        self, cause: str, mechanism: str, recovery_s: float | None, rollback_steps: int | None,
        rank: int | None = None,
    ) -> None:
        """A recovery finished (first step completed after the fault). `rank`: the rank whose
        fault started it, None when no single rank is to blame (tagged "none")."""
        tags = {"cause": cause, "mechanism": mechanism}
        self._record("ray_resilience_restarts", "inc", 1.0,
                     {**tags, "rank": "none" if rank is None else str(rank)})
        if recovery_s is not None:
            self._record("ray_resilience_recovery_time_s", "observe", recovery_s, tags)
        if rollback_steps is not None:
            self._record("ray_resilience_rollback_steps", "observe", float(rollback_steps), tags)

    def on_goodput(self, report: GoodputReport) -> None:
        """Publish a (possibly in-progress) goodput report's headline numbers."""
        if report.training_goodput is not None:
            self._record("ray_resilience_training_goodput", "set", report.training_goodput)
        if report.infra_goodput is not None:
            self._record("ray_resilience_infra_goodput", "set", report.infra_goodput)

    def _record(
        self, name: str, method: str, value: float, tags: dict[str, str] | None = None
    ) -> None:
        if not self.active:
            return
        try:
            getattr(self._metrics[name], method)(value, tags=tags)
        except Exception:  # metrics are best effort; the run goes on
            self._failed = True
            logger.warning("metric %s failed; metrics export is off for run %s", name,
                           self.run_name, exc_info=True)


class MetricsCallback(Callback):
    """Exports the run's events as metrics (`RunMetrics`)."""

    def __init__(self, metrics: RunMetrics) -> None:
        self.metrics = metrics

    def on_step_completed(self, event: StepCompleted) -> None:
        self.metrics.on_step(event.step)

    def on_checkpoint_saved(self, event: CheckpointSaved) -> None:
        if event.tier is None:  # local snapshots are not checkpoints on their way to storage
            self.metrics.on_checkpoint(event.step, blocking_s=event.blocking_s, committed=False)

    def on_checkpoint_committed(self, event: CheckpointCommitted) -> None:
        self.metrics.on_checkpoint(event.step, committed=True)

    def on_checkpoint_dropped(self, event: CheckpointDropped) -> None:
        self.metrics.on_dropped(event.kind)

    def on_recovery_done(self, event: RecoveryDone) -> None:
        self.metrics.on_restart(event.cause.value, event.mechanism, event.recovery_s,
                                event.rollback_steps, rank=event.rank)

    def on_run_end(self, event: RunEnded) -> None:
        if event.goodput is not None:
            self.metrics.on_goodput(event.goodput)


def _ray_connected() -> bool:
    return ray.is_initialized()


def _create(run_name: str) -> dict[str, Any]:
    created: dict[str, Any] = {}
    for spec in METRIC_SPECS:
        tag_keys = ("run", *spec.tag_keys)
        if spec.kind == "counter":
            metric = ray_metrics.Counter(spec.name, spec.description, tag_keys=tag_keys)
        elif spec.kind == "gauge":
            metric = ray_metrics.Gauge(spec.name, spec.description, tag_keys=tag_keys)
        else:
            metric = ray_metrics.Histogram(spec.name, spec.description,
                                       boundaries=list(spec.boundaries), tag_keys=tag_keys)
        created[spec.name] = metric.set_default_tags({"run": run_name})
    return created
