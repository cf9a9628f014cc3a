"""A worker group without Ray or processes, for driving the supervisor's state machine in tests.

Each rank of each attempt follows a scripted `Act`: it reports `steps` steps through the
supervisor's `heartbeat` (one every `STEP_S` of fake time), then finishes, raises, dies, loses
its node, or hangs. Time is a `FakeClock` that only moves when the supervisor waits on the group
(the way time passes while `ray.wait` blocks), so timeouts are exact and no test sleeps.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ray_resilience._internal.attempt import AttemptOutcome, AttemptSpec, RankLost
from ray_resilience._internal.control.batch import ProgressFolder
from ray_resilience._internal.supervisor.run_record import Clock
from ray_resilience.errors import WorkerError

STEP_S = 0.05
"""Fake seconds per training step."""
MAX_FAKE_S = 600.0
"""A scripted run still going after this much fake time is stuck: the group raises."""


class FakeClock(Clock):
    """Wall and monotonic time that move only when told to."""

    def __init__(self) -> None:
        self.wall, self.mono = 1_000.0, 0.0

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


@dataclasses.dataclass(frozen=True)
class Act:
    """What one rank does in one attempt: `steps` steps, then `end`."""

    end: str = "finish"
    """finish | raise | die | node_lost | hang (silent until interrupted) | stuck (silent, and
    ignores interrupts)."""
    steps: int = 3
    held: int = 0
    """Of its step reports, the first `held` sit in the node's agent (the supervisor gets them
    from `drain_progress`) and the rest travel in the attempt's outcome: an attempt that ends
    within one forwarding interval of its start (0 = every report is a heartbeat)."""


class Ref:
    """A run future (or nothing else: identity is all the supervisor needs)."""

    def __init__(self, rank: int, attempt: int, act: Act, t0: float) -> None:
        self.rank, self.attempt, self.act = rank, attempt, act
        self.reports = [t0 + (i + 1) * STEP_S for i in range(act.steps)]
        ends = {"finish", "raise", "die", "node_lost"}
        self.ready_at: float | None = t0 + (act.steps + 1) * STEP_S if act.end in ends else None
        self.end = act.end
        self.sent = 0
        self.unsent: list[tuple[int, dict]] = []
        """Reports the outcome carries (`Act.held`)."""


class DummyWorkerGroup:
    """The methods of `WorkerGroup` the supervisor calls, over scripted ranks."""

    def __init__(self, clock: FakeClock, script: dict[tuple[int, int], Act], *, world_size: int,
                 no_capacity: tuple[int, ...] = ()) -> None:
        self.clock, self.script, self.no_capacity = clock, script, no_capacity
        self.supervisor: Any = None
        """Receives the ranks' heartbeats; set once the supervisor exists."""
        self.world = list(range(world_size))
        self.info = [self._info(r, generation=0) for r in self.world]
        self.current: dict[int, Ref] = {}
        self.launched: list[list[AttemptSpec]] = []
        self.killed: list[int] = []
        self.interrupted: list[list[int]] = []
        self.held: list[tuple[int, dict]] = []
        """(attempt, report) the node's agent holds (`Act.held`)."""
        self.replaced: list[list[int]] = []
        self.dropped: list[int] = []
        self.shut_down = False
        self.spares_pending = self.prestart_pending = False

    def factory(self, **_: Any) -> DummyWorkerGroup:
        """Stands in for `create_worker_group`."""
        return self

    @property
    def world_size(self) -> int:
        return len(self.world)

    @staticmethod
    def _info(rank: int, generation: int) -> dict[str, Any]:
        return {"node_id": "node-a", "pid": 1000 * (generation + 1) + rank}

    # --- set-up and launch ------------------------------------------------------------------

    def reserve(self, timeout_s: float) -> None: ...
    def spawn(self) -> None: ...
    def prestart(self) -> list[str]:
        return []  # nodes asked: none, no raylet here
    def replenish_spares(self, exclude: set[str]) -> None: ...

    def bundle_nodes(self) -> list[str]:
        return ["node-a"] * self.world_size

    def master(self) -> tuple[str, int]:
        return "127.0.0.1", 29500 + len(self.launched)

    def layout(self) -> tuple[list[int], list[int], list[int]]:
        n = self.world_size
        return list(range(n)), [n] * n, [0] * n

    def launch(self, specs: list[AttemptSpec]) -> dict[Ref, int]:
        self.launched.append(specs)
        self.current = {s.rank: Ref(s.rank, s.attempt, self.script.get((s.attempt, s.rank), Act()),
                                    self.clock.monotonic()) for s in specs}
        return {ref: rank for rank, ref in self.current.items()}

    # --- what the supervisor waits on -------------------------------------------------------

    def wait(self, refs: list[Ref], timeout_s: float, *, num_returns: int = 1) -> list[Ref]:
        if self.clock.monotonic() > MAX_FAKE_S:
            raise RuntimeError("the scripted run did not end")
        if not refs:
            return []
        due = sorted(r.ready_at for r in refs if r.ready_at is not None)
        until = self.clock.monotonic() + timeout_s
        if len(due) >= num_returns and due[num_returns - 1] <= until:
            until = max(self.clock.monotonic(), due[num_returns - 1])
        self._advance_to(until)
        return [r for r in refs if r.ready_at is not None and r.ready_at <= self.clock.monotonic()]

    def _advance_to(self, until: float) -> None:
        """Moves time forward, delivering the heartbeats that fall due on the way."""
        sends = sorted(((t, ref) for ref in self.current.values() for t in ref.reports[ref.sent:]
                        if t <= until), key=lambda item: item[0]) if self.supervisor else []
        for t, ref in sends:
            self.clock.advance(max(0.0, t - self.clock.monotonic()))
            ref.sent += 1
            step = ref.sent
            report = {"rank": ref.rank, "step": step, "time": self.clock.time()}
            if ref.act.held:  # held by the agent, or carried by the outcome
                (self.held if step <= ref.act.held else ref.unsent).append((ref.attempt, report))
                continue
            self.supervisor.heartbeat(ref.rank, ref.attempt, step, self.clock.time(), [report],
                                      [], self.clock.time())
        self.clock.advance(max(0.0, until - self.clock.monotonic()))

    def outcome(self, ref: Ref, rank: int) -> AttemptOutcome | RankLost:
        if ref.end in ("die", "node_lost", "killed"):
            return RankLost(rank=rank, node_lost=ref.end == "node_lost", detail=ref.end)
        error = None
        if ref.end == "raise":
            error = WorkerError(ranks=[rank], attempt=ref.attempt, exc_type="RuntimeError",
                                message="boom", traceback="Traceback: boom")
        status = {"finish": "finished", "raise": "failed"}.get(ref.end, "interrupted")
        return AttemptOutcome(rank=rank, attempt=ref.attempt, status=status, error=error,
                              failed_at=self.clock.time() if error else None,
                              return_value=f"r{rank}".encode() if status == "finished" else None,
                              last_step=ref.sent or None, last_step_time=self.clock.time(),
                              metrics=[report for _, report in ref.unsent])

    # --- repair -------------------------------------------------------------------------------

    def interrupt(self, ranks: list[int], attempt: int,
                  stacks_after_s: float | None = None) -> None:
        self.interrupted.append(sorted(ranks))
        for rank in ranks:
            ref = self.current[rank]
            del ref.reports[ref.sent:]  # an interrupted rank reports no further step
            if ref.ready_at is None and ref.end != "stuck":
                ref.end, ref.ready_at = "interrupted", self.clock.monotonic() + 0.01

    def kill(self, rank: int) -> None:
        self.killed.append(rank)
        ref = self.current.get(rank)
        if ref is not None and (ref.ready_at is None or ref.ready_at > self.clock.monotonic()):
            del ref.reports[ref.sent:]
            ref.end, ref.ready_at = "killed", self.clock.monotonic()

    def health(self, ranks: list[int], timeout_s: float) -> dict[int, str]:
        return {}

    def replace(self, ranks: list[int], timeout_s: float, exclude: set[str] | None = None,
                on_node: Any = None) -> list[int]:
        self.replaced.append(sorted(ranks))
        for rank in ranks:
            self.info[rank] = self._info(rank, generation=len(self.replaced))
        return [r for r in ranks if r in self.no_capacity]

    def drop(self, ranks: list[int]) -> None:
        self.dropped.extend(ranks)
        for rank in sorted(ranks, reverse=True):
            del self.world[rank], self.info[rank]
        self.world = list(range(len(self.world)))

    def available_resources(self) -> dict[str, float]:
        return {"CPU": 0.0}

    # --- where ranks are, and the end -----------------------------------------------------------

    def stop_at(self, ranks: list[int], attempt: int, step: int, deadline: float) -> None:
        """No scripted rank is ever preempted."""

    def draining_nodes(self) -> dict[str, float]:
        return {}

    def node_of_rank(self, rank: int) -> str:
        return "node-a"

    def node_ids(self) -> list[str]:
        return ["node-a"] * self.world_size

    def progress_sinks(self, interval_s: float) -> list[None]:
        return [None] * self.world_size  # heartbeats go straight to the supervisor

    def drain_progress(self) -> list[Any]:
        """What the node's agent holds (`Act.held`), as one batch."""
        folder = ProgressFolder("node-a")
        for attempt, report in self.held:
            folder.add(report["rank"], attempt, report["step"], None, [report], [],
                       report["time"], [])
        self.held = []
        batch = folder.take()
        return [batch] if batch else []

    def pids(self) -> list[int]:
        return [i["pid"] for i in self.info]

    def shutdown(self, timeout_s: float) -> None:
        self.shut_down = True
