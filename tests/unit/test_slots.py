"""A rank's snapshot slots (`rank/slots.py`): saves and local-tier-only steps each have their own
share, so the local tier never takes the slot a committed save needs (on one H200 with a 2 GB
state, local writes every 5 steps held both of two shared slots whenever a save came, and every
save after the first was skipped)."""

from __future__ import annotations

import numpy as np
import pytest

from ray_resilience._internal.checkpoint.rank.slots import (
    MAX_SAVE_SLOTS,
    LocalWrite,
    SlotPool,
    SlotState,
)
from ray_resilience._internal.checkpoint.rank.snapshot import StagingBuffers
from ray_resilience._internal.checkpoint.rank.state_cache import StateCache
from ray_resilience._internal.checkpoint.wire import SaveTicket
from tests.support.local_snapshots import _trained

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def source():
    model, optimizer = _trained()
    return StateCache().source(model, optimizer)


def _take(pool: SlotPool, source, step: int, *, save: bool, state: SlotState,
          may_withdraw: bool = True):
    slot, withdrawn = pool.acquire(source.items, source.tensors, may_withdraw=may_withdraw,
                                   local_only=not save)
    if slot is None:
        return None, withdrawn
    slot.release()
    if save:
        slot.ticket = SaveTicket(session="s", step=step, rank=0, world_size=1,
                                 items=source.items, owned=[], planner_data=None,
                                 staged_at=0.0)
    else:
        slot.local = LocalWrite("s", step, "digest")
    slot.state = state
    return slot, withdrawn


def test_a_save_finds_a_slot_while_a_local_write_and_the_previous_save_hold_theirs(source):
    pool = SlotPool()
    putting, _ = _take(pool, source, 10, save=True, state=SlotState.PUTTING)
    local, _ = _take(pool, source, 15, save=False, state=SlotState.LOCAL)
    staged, withdrawn = _take(pool, source, 20, save=True, state=SlotState.STAGED)
    assert staged is not None and withdrawn is None
    assert len({id(putting), id(local), id(staged)}) == 3 and len(pool.slots) == 3
    # The saves' share is full: a newer save replaces the staged one (coalesce) ...
    newer, withdrawn = _take(pool, source, 30, save=True, state=SlotState.STAGED)
    assert newer is staged and withdrawn is staged
    # ... or, without coalescing, is skipped; the local write's slot is never taken.
    assert _take(pool, source, 40, save=True, state=SlotState.STAGED,
                 may_withdraw=False) == (None, None)
    assert local.state is SlotState.LOCAL and local.local.step == 15
    assert sum(s.ticket is not None and s.state.busy for s in pool.slots) == MAX_SAVE_SLOTS


def test_a_local_step_waits_for_the_previous_local_write_not_for_a_save(source):
    pool = SlotPool()
    local, _ = _take(pool, source, 5, save=False, state=SlotState.LOCAL)
    assert _take(pool, source, 6, save=False, state=SlotState.COPYING) == (None, None)
    local.release()  # its write ended
    again, _ = _take(pool, source, 6, save=False, state=SlotState.COPYING)
    assert again is local and len(pool.slots) == 1
    # A step that is both a save and a local step takes a save's slot.
    both, _ = _take(pool, source, 10, save=True, state=SlotState.LOCAL)
    both.local = LocalWrite("s", 10, "digest")
    assert both is not local and pool.local_only() == [local]


def test_a_slot_laid_over_a_local_file_is_never_a_saves_and_holds_no_staging_memory(source):
    """On CPU a local-only step's slot is the local file's mapping: a save never takes it (its
    snapshot must be shared memory the writer can adopt), it counts in the local-only share, it
    is reused while its file's mapping and the layout hold, and it goes when the tier does."""
    pool = SlotPool()
    memory = [np.zeros(StagingBuffers.length(source.items), np.uint8) for _ in range(2)]
    direct = pool.acquire_direct(source.items, source.tensors, 0, memory[0])
    assert direct.direct == 0 and direct.buffers.handle is None and pool.staging_bytes == 0
    assert direct.buffers.data.ctypes.data == memory[0].ctypes.data
    direct.state, direct.local = SlotState.COPYING, LocalWrite("s", 1, "digest")
    assert pool.acquire_direct(source.items, source.tensors, 1, memory[1]) is None  # share full
    direct.release()
    save, _ = _take(pool, source, 2, save=True, state=SlotState.STAGED)
    assert save is not direct and save.direct is None and save.buffers.handle is not None
    assert pool.acquire_direct(source.items, source.tensors, 0, memory[0]) is direct
    other = pool.acquire_direct(source.items, source.tensors, 1, memory[1])
    assert other is not direct and other.direct == 1
    assert pool.staging_bytes == save.buffers.nbytes
    pool.drop_direct()
    assert pool.slots == [save]
