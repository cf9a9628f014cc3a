"""Snapshot slots: a rank's reusable staging buffers, FREE -> COPYING [-> LOCAL] -> STAGED ->
VOTING -> PUTTING -> FREE for a save, FREE -> COPYING -> LOCAL -> FREE for a local-tier step;
saves hold at most `MAX_SAVE_SLOTS` and a STAGED slot may be withdrawn for a newer save;
local-tier-only snapshots hold at most `MAX_LOCAL_ONLY_SLOTS` besides, so the local tier never
takes the slot a committed save needs. On CPU a local-only step's slot is laid over the local
file it goes to (`Slot.direct`): no staging memory of its own.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import time
from typing import Any

from ray_resilience._internal.checkpoint.rank.snapshot import StagingBuffers
from ray_resilience._internal.checkpoint.shm import SharedBuffer
from ray_resilience._internal.checkpoint.wire import SaveTicket

MAX_SAVE_SLOTS = 2
"""Slots a rank's saves hold at most: one being voted on or handed off, one staged behind it."""
MAX_LOCAL_ONLY_SLOTS = 1
"""Slots the snapshots of local-tier-only steps hold at most (a local step waits for the previous
one's write; "auto" picks an interval the writes keep up with). On one H200 with a 2 GB state
and a local step every 5 steps, every save after the first was skipped for want of one of two
shared slots (docs/benchmarks.md, "GPU check")."""
MAX_SLOTS = MAX_SAVE_SLOTS + MAX_LOCAL_ONLY_SLOTS
MAX_SPARES = 1
"""Buffers the writer gave back that a rank keeps for its next slots: with the memory tier, a
save's buffer comes back when the next commit replaces it, before the save after that."""


class SlotState(enum.Enum):
    FREE = "free"
    COPYING = "copying"
    LOCAL = "local"
    """Being written to the local tier (then STAGED for a save, else FREE)."""
    STAGED = "staged"
    VOTING = "voting"
    PUTTING = "putting"

    @property
    def busy(self) -> bool:
        """Holds a snapshot that is not yet handed off or dropped."""
        return self is not SlotState.FREE


@dataclasses.dataclass(eq=False)
class Slot:
    buffers: StagingBuffers
    state: SlotState = SlotState.FREE
    ticket: SaveTicket | None = None
    blobs: list[bytes] = dataclasses.field(default_factory=list)
    extra: Any = None
    """The step's `ExtraSnapshot` (encoded when the slot is handed off)."""
    torn: str | None = None
    """Why the snapshot cannot be trusted (a tensor changed while it was copied)."""
    event: Any = None
    """On GPU: the CUDA event that marks the end of the device-to-host copies."""
    local: LocalWrite | None = None
    """The local-tier write this snapshot still owes (None: none, or done)."""
    copy_cpu_s: float = 0.0
    """CPU seconds the copier thread spent copying into the buffers."""
    given_away: bool = False
    """The writer adopted the buffers' shared memory with the snapshot: never written again
    (the pool drops this slot once it is free)."""
    direct: int | None = None
    """The local-tier file whose mapping the buffers are (a local-only step's slot on CPU; never
    used for a save)."""

    @property
    def step(self) -> int | None:
        if self.ticket is not None:
            return self.ticket.step
        return None if self.local is None else self.local.step

    def wait_copied(self) -> None:
        """On GPU: blocks until the device-to-host copies into the buffers are done."""
        if self.event is not None:
            self.event.synchronize()

    def release(self) -> None:
        self.state, self.ticket, self.blobs, self.extra = SlotState.FREE, None, [], None
        self.torn, self.event, self.local, self.copy_cpu_s = None, None, None, 0.0


@dataclasses.dataclass(frozen=True)
class LocalWrite:
    """A snapshot's destination in the local tier."""

    session: str
    step: int
    layout: str
    """The digest of the save plan's layout (`local_tier.layout_digest`)."""


class SlotPool:
    """The slots of one rank (created on demand, reused while the state's layout holds). A slot
    whose memory the writer adopted is dropped once free; a new slot takes a spare (memory the
    writer gave back, `add_spare`) of its size before allocating."""

    def __init__(self) -> None:
        self.slots: list[Slot] = []
        self.spares: list[SharedBuffer] = []
        """Shared memory the writer gave back, at most `MAX_SPARES`, newest last."""

    @property
    def staging_bytes(self) -> int:
        return (sum(s.buffers.nbytes for s in self.slots if not s.given_away and s.direct is None)
                + sum(b.handle.nbytes for b in self.spares))

    def wants_spare(self, nbytes: int) -> bool:
        """Whether a spare of `nbytes` would be kept (none of that size is held yet)."""
        return not any(b.handle.nbytes == nbytes for b in self.spares)

    def add_spare(self, buffer: SharedBuffer) -> bool:
        """Keeps `buffer` for the next new slot of its size; False (not kept) when one of that
        size is held. The oldest spare beyond `MAX_SPARES` goes."""
        if not self.wants_spare(buffer.handle.nbytes):
            return False
        self.spares.append(buffer)
        del self.spares[:-MAX_SPARES]
        return True

    def _spare(self, nbytes: int) -> SharedBuffer | None:
        for buffer in self.spares:
            if buffer.handle.nbytes == nbytes:
                self.spares.remove(buffer)
                return buffer
        return None

    def busy(self) -> bool:
        return any(s.state.busy for s in self.slots)

    def in_state(self, *states: SlotState) -> list[Slot]:
        return [s for s in self.slots if s.state in states]

    def local_only(self) -> list[Slot]:
        """Busy slots holding a local-tier-only snapshot (no save ticket)."""
        return [s for s in self.slots if s.state.busy and s.ticket is None and s.local is not None]

    def acquire(self, items: list, sources: list, *, may_withdraw: bool,
                local_only: bool = False) -> tuple[Slot | None, Slot | None]:
        """A slot for a new snapshot of `items` (`local_only`: a local-tier step that is no save):
        (slot, the STAGED slot withdrawn for it under coalesce); (None, None) when the
        snapshot's kind holds all the slots it may."""
        self.slots = [s for s in self.slots if not (s.given_away and s.state is SlotState.FREE)]
        if self._full(local_only):
            return self._withdrawn(items) if may_withdraw and not local_only else (None, None)
        staging = [s for s in self.slots if s.direct is None]
        for slot in staging:
            if slot.state is SlotState.FREE and slot.buffers.matches(items):
                return slot, None
        stale = [s for s in staging if s.state is SlotState.FREE]
        if stale or len(staging) < MAX_SLOTS:
            if stale:  # the state's layout changed: replace a buffer set of the old layout
                self.slots.remove(stale[0])
            slot = Slot(StagingBuffers(items, sources, self._spare))
            self.slots.append(slot)
            return slot, None
        return self._withdrawn(items) if may_withdraw else (None, None)

    def _full(self, local_only: bool) -> bool:
        """Whether the snapshot's kind holds all the slots it may."""
        held_local = len(self.local_only())
        if local_only:
            return held_local >= MAX_LOCAL_ONLY_SLOTS
        return sum(s.state.busy for s in self.slots) - held_local >= MAX_SAVE_SLOTS

    def acquire_direct(self, items: list, sources: list, file: int,
                       memory: Any) -> Slot | None:
        """A local-only step's slot laid over local-tier file `file`'s mapping `memory` (the one
        laid there before while the layout and mapping hold); None while the local-only
        snapshots hold all their slots."""
        if self._full(local_only=True):
            return None
        for slot in self.slots:
            if slot.direct == file and slot.state is SlotState.FREE:
                if slot.buffers.matches(items) \
                        and slot.buffers.data.ctypes.data == memory.ctypes.data:
                    return slot
                self.slots.remove(slot)
                break
        slot = Slot(StagingBuffers(items, sources, memory=memory), direct=file)
        self.slots.append(slot)
        return slot

    def drop_direct(self) -> None:
        """Forgets the free slots laid over local-tier files (the tier went off)."""
        self.slots = [s for s in self.slots if s.direct is None or s.state.busy]

    def _withdrawn(self, items: list) -> tuple[Slot | None, Slot | None]:
        staged = [s for s in self.slots
                  if s.state is SlotState.STAGED and s.buffers.matches(items)]
        if not staged:
            return None, None
        oldest = min(staged, key=lambda s: s.step)
        return oldest, oldest

    def close(self) -> None:
        """Lets every slot's and spare's memory go now (the pipeline closed and its threads
        ended). Without it the closed pipeline's reference cycles hold it until Python's cycle
        collector runs: a new attempt's slots would be allocated beside the old ones."""
        for slot in self.slots:
            slot.release()
            slot.buffers.close()
        for spare in self.spares:
            spare.close()
        self.slots, self.spares = [], []

    def drop_unvoted(self) -> int:
        """Frees every snapshot not yet voted on (a new session begins); returns how many."""
        dropped = 0
        for slot in self.in_state(SlotState.STAGED):
            slot.release()
            dropped += 1
        return dropped


class RankSaveStats:
    """Counters and recent timings of one rank's saves."""

    def __init__(self) -> None:
        self.counts = collections.Counter()
        self.blocking_s: collections.deque[float] = collections.deque(maxlen=10_000)
        self.guard_wait_s: collections.deque[float] = collections.deque(maxlen=10_000)
        self.durable_latency_s: collections.deque[float] = collections.deque(maxlen=10_000)
        self.last_error: str | None = None
        self.last_durable_step: int | None = None
        self.phases: dict[str, collections.deque[float]] = collections.defaultdict(
            lambda: collections.deque(maxlen=10_000))

    def phase(self, name: str, since: float) -> None:
        """Records how long a part of a save took (from `since` until now)."""
        self.phases[name].append(time.perf_counter() - since)

    def as_dict(self) -> dict[str, Any]:
        return {**dict(self.counts), "blocking_s": list(self.blocking_s),
                "guard_wait_s": list(self.guard_wait_s),
                "phases_s": {k: list(v) for k, v in self.phases.items()},
                "durable_latency_s": list(self.durable_latency_s),
                "last_error": self.last_error, "last_durable_step": self.last_durable_step}
