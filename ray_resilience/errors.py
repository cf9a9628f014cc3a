"""Typed errors: each message says what happened, the likely cause, and the setting to change.
All derive from `ResilienceError` (config errors also from `ValueError`) and pickle.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def format_ranks(ranks: Iterable[int]) -> str:
    """`[0-15, 17, 20, 21]`: runs of three or more ranks as ranges, so a message about
    thousands of ranks stays one short line."""
    ordered, parts, i = sorted(set(ranks)), [], 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{ordered[i]}-{ordered[j]}")
        else:
            parts += [str(r) for r in ordered[i:j + 1]]
        i = j + 1
    return f"[{', '.join(parts)}]"


class ResilienceError(Exception):
    """Base class of every error raised by ray_resilience."""


class ConfigError(ResilienceError, ValueError):
    """A setting has an invalid value. Raised before any actor starts."""

    def __init__(self, field: str, value: object, fix: str) -> None:
        self.field, self.value, self.fix = field, value, fix
        super().__init__(f"{field}={value!r} is invalid: {fix}")

    def __reduce__(self):
        return (type(self), (self.field, self.value, self.fix))


class InsufficientResourcesError(ConfigError):
    """The cluster can never host the requested workers (asked vs available)."""

    def __init__(self, field: str, value: object, asked: dict, available: dict, fix: str) -> None:
        self.asked, self.available = asked, available
        ConfigError.__init__(self, field, value,
                             f"asked for {asked}, the cluster has {available}. {fix}")
        self.args = (str(self),)

    def __reduce__(self):
        return (_rebuild_resources_error,
                (self.field, self.value, self.asked, self.available, self.fix))


def _rebuild_resources_error(field, value, asked, available, fix):  # pragma: no cover - pickling
    err = InsufficientResourcesError.__new__(InsufficientResourcesError)
    err.field, err.value, err.fix, err.asked, err.available = field, value, fix, asked, available
    err.args = (f"{field}={value!r} is invalid: asked for {asked}, the cluster has {available}. "
                f"{fix}",)
    return err


class WorkerError(ResilienceError):
    """The user's train function raised on `ranks` (every rank with the same error). `cause` is the
    original exception when it pickled; `exc_type` and `traceback` are always set."""

    def __init__(
        self, *, ranks: Sequence[int], attempt: int, exc_type: str, message: str,
        traceback: str, cause: BaseException | None = None,
    ) -> None:
        self.ranks, self.attempt = list(ranks), attempt
        self.exc_type, self.message = exc_type, message
        self.traceback, self.cause = traceback, cause
        who = f"rank {self.ranks[0]}" if len(self.ranks) == 1 else f"ranks {self.ranks}"
        super().__init__(
            f"{who} (attempt {attempt}) raised {exc_type}: {message}\n"
            f"Traceback from {who}:\n{traceback.rstrip()}"
        )

    @property
    def rank(self) -> int:
        return self.ranks[0]

    def __reduce__(self):
        return (_rebuild_worker_error, (self.ranks, self.attempt, self.exc_type, self.message,
                                        self.traceback, self.cause))

    def same_failure(self, other: WorkerError) -> bool:
        return (self.exc_type, self.message) == (other.exc_type, other.message)


def _rebuild_worker_error(ranks, attempt, exc_type, message, traceback, cause):
    return WorkerError(ranks=ranks, attempt=attempt, exc_type=exc_type, message=message,
                       traceback=traceback, cause=cause)


class WorkerDiedError(ResilienceError):
    """A rank's actor process died (SIGKILL, OOM killer, segfault, lost node)."""

    def __init__(self, ranks: Sequence[int], attempt: int, detail: str) -> None:
        self.ranks, self.attempt, self.detail = list(ranks), attempt, detail
        super().__init__(f"rank(s) {format_ranks(self.ranks)} died in attempt {attempt}: {detail}")

    def __reduce__(self):
        return (type(self), (self.ranks, self.attempt, self.detail))


class HangError(ResilienceError):
    """Ranks stopped making progress for longer than the heartbeat timeout."""

    def __init__(self, ranks: Sequence[int], attempt: int, silent_s: float, setting: str,
                 timeout_s: float) -> None:
        self.ranks, self.attempt, self.silent_s = list(ranks), attempt, silent_s
        self.setting, self.timeout_s = setting, timeout_s
        super().__init__(
            f"ranks {format_ranks(self.ranks)} made no progress for {silent_s:.1f} s in attempt "
            f"{attempt} ({setting}={timeout_s}). Likely a rank hung in a collective or in user "
            f"code; if the phase is legitimately slow (first compile, checkpoint load), raise "
            f"{setting}."
        )

    def __reduce__(self):
        return (type(self), (self.ranks, self.attempt, self.silent_s, self.setting, self.timeout_s))


class RestartLimitError(ResilienceError):
    """Recovery gave up: a restart limit was reached or restarts made no progress."""

    def __init__(self, *, setting: str, limit: int, causes: Sequence[str], ranks: Sequence[int],
                 last_error: BaseException | None = None) -> None:
        self.setting, self.limit = setting, limit
        self.causes, self.ranks, self.last_error = list(causes), sorted(set(ranks)), last_error
        super().__init__(
            f"gave up after {len(self.causes)} restarts ({setting}={limit}); ranks involved: "
            f"{self.ranks}; causes in order: {self.causes}. Raise {setting} if the faults are "
            f"transient, otherwise fix the failing rank. Last error: {last_error}"
        )

    def __reduce__(self):
        return (_rebuild_restart_error, (self.setting, self.limit, self.causes, self.ranks,
                                         self.last_error))


def _rebuild_restart_error(setting, limit, causes, ranks, last_error):
    return RestartLimitError(setting=setting, limit=limit, causes=causes, ranks=ranks,
                             last_error=last_error)


class PreemptedError(ResilienceError):
    """Nodes hosting ranks were drained (spot reclaim, eviction) and the run could not move
    their ranks; the step they saved resumes on the next submission."""

    def __init__(self, ranks: Sequence[int], nodes: Sequence[str], step: int, fix: str) -> None:
        self.ranks, self.nodes, self.step, self.fix = list(ranks), list(nodes), step, fix
        super().__init__(f"ranks {self.ranks} were preempted (nodes {self.nodes} draining); "
                         f"every rank saved step {step} first. {fix}")

    def __reduce__(self):
        return (type(self), (self.ranks, self.nodes, self.step, self.fix))


class RunAbortedError(ResilienceError):
    """The run was stopped from the driver (Ctrl-C in `fit()`)."""


class WorkerStartupError(ResilienceError):
    """A rank's actor could not start (its train function or config did not unpickle there, or
    Ray could not create the actor): the run ends before any step, naming rank, node and cause."""

    def __init__(self, *, rank: int, node: str, exc_type: str, message: str, fix: str,
                 traceback: str = "") -> None:
        self.rank, self.node, self.exc_type, self.message = rank, node, exc_type, message
        self.fix, self.traceback = fix, traceback
        super().__init__(f"rank {rank} could not start on node {node}: {exc_type}: {message}. "
                         f"{fix}" + (f"\nTraceback from rank {rank}:\n{traceback.rstrip()}"
                                     if traceback else ""))

    def __reduce__(self):
        return (_rebuild_startup_error, (self.rank, self.node, self.exc_type, self.message,
                                         self.fix, self.traceback))


def _rebuild_startup_error(rank, node, exc_type, message, fix, traceback):
    return WorkerStartupError(rank=rank, node=node, exc_type=exc_type, message=message, fix=fix,
                              traceback=traceback)


class TrainingFailedError(ResilienceError):
    """Raised by `ResilientTrainer.fit()` when the run failed (Ray Train raises its namesake):
    `result` is the run's `Result`, `error` (also `__cause__`) the error that ended it.
    `fit(raise_on_failure=False)` returns the failed `Result` instead."""

    def __init__(self, result: Any) -> None:
        self.result, self.error = result, result.error
        cause = self.error
        super().__init__(
            f"training run at {result.path} {result.state} after {result.attempts} attempt(s): "
            f"{type(cause).__name__}: {cause}")

    def __reduce__(self):
        return (type(self), (self.result,))
