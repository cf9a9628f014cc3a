"""What the supervisor's `run()` hands the driver: one typed, picklable `RunOutcome`."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ray_resilience.callbacks import CheckpointDropped
from ray_resilience.errors import RunAbortedError
from ray_resilience.result import Result

if TYPE_CHECKING:
    from ray_resilience.goodput import GoodputReport


_LISTED_LAST = {"restart": 1, "skipped": 2, "coalesced": 2}
"""Dropped-save kinds the driver's warning lists after the others (a fault's restart; the
in-flight policy's, whose save a newer one replaced)."""


@dataclasses.dataclass(kw_only=True)
class RunOutcome:
    """A run's end as the supervisor saw it; `to_result` makes the user's `Result` of it."""

    state: str
    """"finished", "failed" or "aborted"."""
    error: BaseException | None = None
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The last metrics rank 0 reported."""
    metrics_history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Rank 0's newest reports (the driver reads the full record from the metrics log)."""
    control: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The control plane's counters: batches, reports, agent restarts, the metrics log's path."""
    attempts: int = 0
    faults: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """`DetectedFault.describe()` of every fault, in order (JSON-safe)."""
    return_values: list[bytes | None] = dataclasses.field(default_factory=list)
    """Each rank's pickled return value: only the driver unpickles the user's types."""
    worker_pids: list[int] = dataclasses.field(default_factory=list)
    wall_s: float = 0.0
    goodput: GoodputReport | None = None
    timeouts: dict[str, Any] | None = None
    checkpoint: dict[str, Any] | None = None
    phases: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    dropped_saves: list[CheckpointDropped] = dataclasses.field(default_factory=list)
    """Every save asked for and never committed (the first 1000), in the order it was lost."""
    dropped_total: int = 0
    """How many saves were dropped in all."""
    callback_failures: dict[str, int] = dataclasses.field(default_factory=dict)
    """Hook calls that raised, by "CallbackClass.hook" (each logged in the supervisor)."""

    @classmethod
    def lost_supervisor(cls, exc: BaseException) -> RunOutcome:
        """The outcome when the supervisor actor itself died (its record died with it)."""
        return cls(state="failed", error=RunAbortedError(f"the supervisor actor died: {exc}"))

    def dropped_summary(self) -> str | None:
        """One line on the dropped saves for the driver's warning; None when there were none.
        Saves lost to a problem (torn, failed, ...) come first, then those a restart dropped,
        then those the in-flight policy replaced by a newer save, so a busy run's routine
        coalescing does not push the save that matters out of the line."""
        if not self.dropped_total:
            return None
        ordered = sorted(self.dropped_saves, key=lambda d: _LISTED_LAST.get(d.kind, 0))
        shown = "; ".join(f"step {d.step}{'' if d.rank is None else f' rank {d.rank}'}: "
                          f"{d.kind} ({d.reason})" for d in ordered[:5])
        more = self.dropped_total - min(len(self.dropped_saves), 5)
        kinds = Counter(d.kind for d in ordered)  # in listing order
        counted = ""
        if len(kinds) > 1 and len(self.dropped_saves) == self.dropped_total:
            counted = f" ({', '.join(f'{n} {kind}' for kind, n in kinds.items())})"
        return (f"{self.dropped_total} checkpoint save(s) were not committed{counted}: {shown}"
                + (f"; and {more} more (Result.checkpoint['dropped'])" if more > 0 else ""))

    def to_result(self, path: str, loads: Callable[[bytes], Any],
                  history: list[dict[str, Any]] | None = None) -> Result:
        """The user's `Result`; `loads` unpickles the ranks' return values; `history`, read
        from the metrics log, replaces the supervisor's window."""
        checkpoint = self.checkpoint
        if checkpoint is not None:
            checkpoint = {**checkpoint, "dropped": [d.describe() for d in self.dropped_saves],
                          "dropped_total": self.dropped_total}
        return Result(
            metrics=self.metrics, path=path, control=self.control,
            metrics_history=self.metrics_history if history is None else history,
            error=self.error, state=self.state, attempts=self.attempts, faults=self.faults,
            return_values=[None if v is None else loads(v) for v in self.return_values],
            worker_pids=self.worker_pids, wall_s=self.wall_s, goodput=self.goodput,
            timeouts=self.timeouts, checkpoint=checkpoint, phases=self.phases)
