"""Hooks into a run's life, called in the supervisor actor: subclass `Callback`, pass instances as
`RunConfig(callbacks=[...])`.

Every hook runs on the supervisor's state-machine thread, one at a time and in the order the
events happened, usually within one monitor interval of the event (during a repair, once the
repair step is over). Each gets a small frozen event; times are wall-clock seconds
(`time.time()`) of the supervisor's node. A hook must return quickly (the supervisor does
nothing else meanwhile); an exception it raises is logged and never fails the run. Callbacks
travel to the supervisor actor pickled: what they record stays there, so export it (a file,
a metrics system, another actor) rather than reading it back from the driver's instance.
The built-in metrics, goodput timeline and live display are callbacks of the same kind.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, ClassVar

from ray_resilience.policy.state import FaultCause

if TYPE_CHECKING:
    from ray_resilience.goodput import GoodputReport

__all__ = ["Callback", "CheckpointCommitted", "CheckpointDropped", "CheckpointSaved",
           "FaultDetected", "RecoveryDone", "RunEnded", "RunStarted", "StateChanged",
           "StepCompleted"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunStarted:
    """The ranks' actors are up; the first attempt is about to launch."""

    hook: ClassVar[str] = "on_run_start"
    run_name: str
    world_size: int
    start_step: int
    """The newest committed checkpoint's step when resuming a run of the same name, else 0."""
    t: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class StateChanged:
    """The supervisor moved from `previous` to `state` (labels such as "running", "respawning")."""

    hook: ClassVar[str] = "on_state_change"
    previous: str
    state: str
    attempt: int
    """The attempt in force after the change (RUNNING after a repair starts a new attempt)."""
    t: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepCompleted:
    """Every rank reported global step `step` (a rollback repeats step numbers)."""

    hook: ClassVar[str] = "on_step_completed"
    step: int
    attempt: int
    world_size: int
    t: float
    """When the last rank finished the step (its report time)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointSaved:
    """Every rank returned to training after saving `step` (`tier` "local" for node-local
    snapshots, None for checkpoints on their way to storage)."""

    hook: ClassVar[str] = "on_checkpoint_saved"
    step: int
    blocking_s: float
    """The longest any rank's training thread was blocked by the save."""
    tier: str | None
    t: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointCommitted:
    """Checkpoint `step` is durable in storage and loadable (its commit marker exists)."""

    hook: ClassVar[str] = "on_checkpoint_committed"
    step: int
    t: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointDropped:
    """A save of `step` that was asked for will never be committed (`Result.checkpoint["dropped"]`
    lists them all)."""

    hook: ClassVar[str] = "on_checkpoint_dropped"
    step: int
    rank: int | None
    """The rank whose save it was; None when the whole step was lost at once (e.g. its commit)."""
    kind: str
    """"torn" (a tensor changed while copied), "skipped" or "coalesced" (the in-flight policy),
    "failed" (writing it failed), "restart" (a new attempt began first), "fenced" (another job
    took the run), "not_committed" (its commit failed or was superseded)."""
    reason: str
    t: float

    def describe(self) -> dict[str, object]:
        """JSON-safe: what `Result.checkpoint["dropped"]` holds for it."""
        return {"step": self.step, "rank": self.rank, "kind": self.kind, "reason": self.reason}


@dataclasses.dataclass(frozen=True, kw_only=True)
class FaultDetected:
    """A fault was detected and is about to be decided on (the policy has not run yet)."""

    hook: ClassVar[str] = "on_fault_detected"
    fault_id: str
    cause: FaultCause
    ranks: tuple[int, ...]
    attempt: int
    step: int | None
    """The newest globally completed step when it was detected."""
    nodes: tuple[str | None, ...]
    kind: str | None
    """The injected fault's kind when a fault plan fired it, else None."""
    t_fault: float | None
    """When it happened, if known (injected faults record it before firing)."""
    t_detect: float
    error: BaseException | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class RecoveryDone:
    """The attempt started after fault `fault_id` completed its first step: training is back."""

    hook: ClassVar[str] = "on_recovery_done"
    fault_id: str
    cause: FaultCause
    mechanism: str
    """"in-process" (every rank kept its process) or "respawn"."""
    attempt: int
    rank: int | None
    """The one rank whose fault started it, None when several were involved."""
    recovery_s: float
    """From the fault (or its detection) to the first step completed after it."""
    resumed_from_step: int
    """The step training resumed from (0: from scratch)."""
    rollback_steps: int | None
    """Steps redone: the step at the fault minus the step resumed from."""
    t: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunEnded:
    """The run reached a terminal state and its actors are torn down; the last hook called."""

    hook: ClassVar[str] = "on_run_end"
    state: str
    """"finished", "failed" or "aborted"."""
    error: BaseException | None
    attempts: int
    final_step: int | None
    goodput: GoodputReport | None
    t: float


class Callback:
    """Base class with a no-op for every hook; override the ones you need.

    Instances must pickle (`RunConfig` checks). Each hook is called in the supervisor actor's
    process, on its state-machine thread, never concurrently with another hook.
    """

    def on_run_start(self, event: RunStarted) -> None:
        """Once, after placement and actor start, before attempt 0 launches. Before any other
        hook except `on_state_change`."""

    def on_state_change(self, event: StateChanged) -> None:
        """On every transition of the supervisor's state machine, after it happened."""

    def on_step_completed(self, event: StepCompleted) -> None:
        """For each global step every rank reported; may lag the ranks by a progress interval."""

    def on_checkpoint_saved(self, event: CheckpointSaved) -> None:
        """When every rank has saved `step` (the commit to storage follows asynchronously)."""

    def on_checkpoint_committed(self, event: CheckpointCommitted) -> None:
        """When a newer committed checkpoint is found (polled up to four times a second, so a
        burst of commits may show only the newest)."""

    def on_checkpoint_dropped(self, event: CheckpointDropped) -> None:
        """For each save that will never be committed, within about a second of it being lost
        (each (step, rank) once; after 1000 in a run, only counted)."""

    def on_fault_detected(self, event: FaultDetected) -> None:
        """For each fault, before the recovery policy decides; the repair follows."""

    def on_recovery_done(self, event: RecoveryDone) -> None:
        """When the first step after a fault completed (not called if the run failed first)."""

    def on_run_end(self, event: RunEnded) -> None:
        """Once, last, after teardown: no rank is running any more."""
