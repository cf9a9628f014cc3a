"""What `ResilientTrainer.fit()` returns."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(kw_only=True)
class Result:
    """The outcome of a run. `error` is None on success, else a `ResilienceError` (a
    `WorkerError` with ranks, type, message, traceback and `cause` when the train function
    raised)."""

    metrics: dict[str, Any]
    """The last metrics rank 0 reported."""
    metrics_history: list[dict[str, Any]]
    """The newest `RunConfig.metrics_history_size` dicts passed to `report` on any rank, with
    `step`, `rank` and `attempt`, in that order, read back from the run's metrics log (every
    report: `<path>/metrics.jsonl`); without the log, rank 0's newest reports."""
    path: str
    """The run's folder: `<storage_path>/<name>`."""
    error: BaseException | None = None
    state: str = "finished"
    attempts: int = 1
    faults: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Every fault detected, in order: cause, ranks, attempt, detection time, error text."""
    return_values: list[Any] = dataclasses.field(default_factory=list)
    """What the train function returned on each rank (None where it did not return)."""
    worker_pids: list[int] = dataclasses.field(default_factory=list)
    wall_s: float = 0.0
    goodput: Any = None
    """GoodputReport of the run (training/infra goodput, per-fault recovery), when computed."""
    checkpoint: Any = None
    """When checkpointing is on: the newest committed step, the loads, the service's counters,
    and "dropped": every save asked for and never committed (step, rank, kind, reason)."""
    timeouts: dict[str, Any] | None = None
    """Hang timeouts in force at the end and the worst interval observed per phase."""
    control: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Control-plane counters: progress batches and reports received, node agent restarts,
    the metrics log's path and size; "background_imports": when the writers' and prestarted
    workers' imports started, and why (`ResilienceConfig.background_imports`), and "prestarts":
    each request for prestarted workers ({"t", "attempt", "nodes"})."""
    phases: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Every timed phase ({"phase", "t_start", "t_end", "attempt", "rank"}): the start-up's
    (placement, start_workers, start_checkpointing), each new rank process's (process_start,
    imports, prewarm) and each attempt's (release_groups, init_process_group,
    checkpoint_load, user phases)."""

    @property
    def local_interval_steps(self) -> int | None:
        """Steps between two local-tier snapshots the ranks last agreed on (0: the tier was
        off; None: no local tier, or the run ended before the interval was chosen)."""
        local = (self.checkpoint or {}).get("local_tier")
        return None if local is None else local["interval_steps"]

    @property
    def ok(self) -> bool:
        return self.error is None

    def raise_for_error(self) -> Result:
        """Raises `error` if the run failed; returns self otherwise (for chaining)."""
        if self.error is not None:
            raise self.error
        return self

    def summary(self) -> dict[str, Any]:
        """A JSON-safe summary (what `results.json` holds)."""
        return {
            "state": self.state, "ok": self.ok, "error": None if self.ok else str(self.error),
            "error_type": None if self.ok else type(self.error).__name__,
            "metrics": self.metrics, "attempts": self.attempts, "faults": self.faults,
            "worker_pids": self.worker_pids, "wall_s": self.wall_s, "path": self.path,
            "num_reports": self.control.get("reports", len(self.metrics_history)),
            "control": self.control, "timeouts": self.timeouts,
            "local_interval_steps": self.local_interval_steps,
            "goodput_summary": None if self.goodput is None else {
                "training_goodput": self.goodput.training_goodput,
                "infra_goodput": self.goodput.infra_goodput},
        }
