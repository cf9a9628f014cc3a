"""What the supervisor hands a rank for one attempt, and what comes back (an outcome, or a loss)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ray_resilience.errors import WorkerError

PROCESS_PHASES = ("process_start", "imports", "prewarm")
"""Phases of a new rank process before its first attempt, reported with that attempt's events:
boot until the actor's `__init__`, the imports there, the warm-up."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttemptSpec:
    """Rendezvous and identity of one rank in one attempt (an attempt id prefixes everything)."""

    attempt: int
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    backend: str
    use_gpu: bool
    run_name: str
    run_dir: str
    process_group_timeout_s: float
    rendezvous_timeout_s: float
    """How long the attempt's rendezvous (every rank joining the new store) may take."""
    progress_interval_s: float
    busy_cap_s: float | None = None
    """How long the rank's training thread, busy at one Python stack, counts as moving
    (`liveness.ActivityProbe`; None: no limit)."""
    checkpoint_spec: Any = None
    resume_hint: int = 0
    """The newest globally completed step when the attempt was launched (0 at the start)."""
    faults: tuple = ()
    """Injected faults for this rank that have not fired yet."""
    datasets: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The run's materialized datasets by name (`DatasetSource`s, the same for every rank)."""
    progress_sink: Any = None
    """Where the rank's side thread sends heartbeats: its node's agent, or None (the supervisor)."""

    @property
    def init_method(self) -> str:
        return f"tcp://{self.master_addr}:{self.master_port}"


@dataclasses.dataclass(kw_only=True)
class AttemptOutcome:
    """How one rank's attempt ended. `status` is finished, failed or interrupted."""

    rank: int
    attempt: int
    status: str
    error: WorkerError | None = None
    failed_at: float | None = None
    """Wall time of the exception: the earliest error across ranks is the root cause."""
    in_distributed: bool = False
    """The exception came out of torch.distributed (a collective, the store): possibly a peer's
    failure seen from here, so the supervisor waits a moment for the peers' errors."""
    return_value: bytes | None = None
    """What the train function returned, cloudpickled by the rank; only the driver unpickles it."""
    metrics: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    last_step: int | None = None
    last_step_time: float | None = None
    checkpoint_saves: list = dataclasses.field(default_factory=list)
    events: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Timed phases the rank went through (e.g. checkpoint_load with its tier)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankLost:
    """A rank's run call ended without an outcome: its actor died."""

    rank: int
    node_lost: bool
    """Ray declared the rank's node dead (else the process alone died)."""
    detail: str
