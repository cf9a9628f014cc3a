"""The writer's shared-memory buffers (`checkpoint/shm.py`), in one process: a buffer goes back to
its pool when its lease is garbage and the next take of that size reuses it; a mapping opens only
the buffer it names (node, device, inode, size); a filled buffer holds the bytes."""

from __future__ import annotations

import dataclasses
import gc
import os
import pickle
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.distributed.checkpoint.planner import WriteItemType

from ray_resilience._internal.checkpoint import shm
from ray_resilience._internal.checkpoint.rank.export import SnapshotExports
from ray_resilience._internal.checkpoint.rank.slots import SlotPool, SlotState
from ray_resilience._internal.checkpoint.rank.snapshot import capture
from ray_resilience._internal.checkpoint.wire import FilledPayload, ShardPayload

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def here(monkeypatch):
    monkeypatch.setattr(shm, "node_here", lambda: "node-a")
    return "node-a"


def test_a_freed_lease_gives_its_buffer_to_the_next_save_of_that_size(here):
    pool = shm.BufferPool(here)
    first = pool.take(0, 4096)
    handle = first.handle
    del first
    gc.collect()
    again = pool.take(0, 4096)
    assert again.handle == handle  # the same memory, not a new buffer
    other_size = pool.take(0, 8192)
    other_rank = pool.take(1, 4096)
    assert other_size.handle != handle and other_rank.handle != handle
    stats = pool.stats()
    assert (stats["created"], stats["reused"], stats["leased"]) == (3, 1, 4)
    assert stats["bytes"] == 4096 + 8192 + 4096 and stats["idle_bytes"] == 0


def test_idle_buffers_beyond_one_per_rank_are_closed(here):
    pool = shm.BufferPool(here)
    leases = [pool.take(0, 1024) for _ in range(3)]
    fds = [lease.handle.fd for lease in leases]
    del leases
    gc.collect()
    stats = pool.stats()
    assert stats["closed"] == 3 - shm.MAX_FREE_PER_KEY
    assert stats["idle_bytes"] == stats["bytes"] == 1024 * shm.MAX_FREE_PER_KEY
    open_fds = [fd for fd in fds if os.path.exists(f"/proc/self/fd/{fd}")]
    assert len(open_fds) == shm.MAX_FREE_PER_KEY


def test_a_rank_fills_the_buffer_the_writer_reads(here):
    pool = shm.BufferPool(here)
    lease = pool.take(0, 1 << 20)
    data = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8)
    maps = shm.BufferMaps()
    assert maps.fill(lease.handle, data)
    assert np.array_equal(lease.array, data)
    view = shm.BufferMaps().array(lease.handle, writable=False)  # a loader's mapping
    assert view is not None and not view.flags.writeable and np.array_equal(view, data)
    with pytest.raises(ValueError, match="cannot fill a buffer"):
        maps.fill(lease.handle, data[:10])


def test_a_mapping_refuses_anything_but_the_buffer_it_names(here):
    pool = shm.BufferPool(here)
    lease = pool.take(0, 4096)
    maps = shm.BufferMaps()
    for wrong in (dataclasses.replace(lease.handle, node_id="node-b"),
                  dataclasses.replace(lease.handle, ino=lease.handle.ino + 1),
                  dataclasses.replace(lease.handle, nbytes=2048),
                  dataclasses.replace(lease.handle, fd=987654)):
        assert maps.array(wrong, writable=True) is None
        assert not maps.fill(wrong, np.zeros(wrong.nbytes, np.uint8))
    assert not lease.array.any()  # nothing was written through a wrong handle


def test_a_process_keeps_few_mappings_of_another_and_none_of_one_gone(here):
    pool = shm.BufferPool(here)
    maps = shm.BufferMaps()
    leases = [pool.take(rank, 64) for rank in range(shm.MAX_MAPS_PER_OWNER + 2)]
    for lease in leases:
        assert maps.array(lease.handle, writable=True) is not None
    assert list(maps._maps) == [lease.handle for lease in leases[-shm.MAX_MAPS_PER_OWNER:]]
    # A mapping of a process that is gone (a replaced writer, a dead rank) is dropped.
    gone = dataclasses.replace(leases[-1].handle, pid=2 ** 22 + 1)  # above pid_max
    maps._maps[gone] = np.zeros(64, np.uint8)
    assert maps.array(pool.take(99, 64).handle, writable=True) is not None
    assert gone not in maps._maps


def test_a_payload_pickles_without_its_lease(here):
    lease = shm.BufferPool(here).take(0, 16)
    payload = ShardPayload(lease.array, [(0, 16)], [], b"{}", keep=lease)
    back = pickle.loads(pickle.dumps(payload))
    assert back.keep is None and np.array_equal(back.data, payload.data)


def _offered(exports, step: int, payload):
    ticket = SimpleNamespace(session="s", step=step)
    with exports._cond:
        return exports.offer(ticket, SimpleNamespace(release=lambda: None), payload)


def test_a_rank_fills_a_lent_buffer_or_says_it_gave_the_snapshot_up(here):
    """The path for slots not in shared memory (pinned on GPU): the rank copies into the buffer
    its writer lends. A snapshot given up first is never handed over."""
    exports = SnapshotExports(cond=threading.Condition(), link=None, config=None,
                              exporter=object(), replace_writer=lambda: None)
    data = np.arange(256, dtype=np.uint8)
    payload = ShardPayload(data, [(0, 256)], [b"x"], b"{}")
    lease = shm.BufferPool(here).take(0, 256)
    _, export_id = _offered(exports, 1, payload)
    filled = exports.export(export_id, lease.handle)
    assert isinstance(filled, FilledPayload) and filled.blobs == [b"x"]
    assert np.array_equal(lease.array, data)
    assert exports.export(export_id, lease.handle) is None  # the offer ended

    _, export_id = _offered(exports, 2, payload)
    wrong = dataclasses.replace(lease.handle, nbytes=128)
    assert exports.export(export_id, wrong) is payload  # cannot fill: the whole snapshot

    _, export_id = _offered(exports, 3, payload)
    assert exports.taken(export_id) and not exports.taken(export_id)


def test_an_adopted_buffer_is_the_same_memory_and_outlives_its_giver(here):
    giver = shm.SharedBuffer(4096, here)
    giver.array[:] = 7
    pool = shm.BufferPool(here)
    lease = pool.adopt(0, giver.handle)
    assert lease is not None and lease.handle.fd != giver.handle.fd
    assert lease.handle.ino == giver.handle.ino and lease.array.tolist() == [7] * 4096
    giver.array[0] = 9  # the same pages, not a copy
    assert lease.array[0] == 9
    giver.close()
    del giver
    gc.collect()
    assert lease.array[1] == 7  # the adopter's own file keeps the memory
    for wrong in (dataclasses.replace(lease.handle, node_id="node-b"),
                  dataclasses.replace(lease.handle, ino=lease.handle.ino + 1),
                  dataclasses.replace(lease.handle, nbytes=2048),
                  dataclasses.replace(lease.handle, fd=987654)):
        assert pool.adopt(0, wrong) is None
    stats = pool.stats()
    assert (stats["adopted"], stats["created"], stats["bytes"]) == (1, 0, 4096)


def test_an_idle_buffer_is_offered_claimed_and_given_away_or_kept(here):
    offered = []
    pool = shm.BufferPool(here, on_idle=offered.append)
    lease = pool.take(3, 1024)
    handle = lease.handle
    del lease
    gc.collect()
    assert offered == [3]
    buffer = pool.claim(3)
    assert buffer is not None and buffer.handle == handle and pool.claim(3) is None
    pool.settle(3, buffer, given=False)  # refused: idle again, not offered again
    assert offered == [3] and pool.stats()["idle_bytes"] == 1024
    buffer = pool.claim(3)
    taker = shm.SharedBuffer.adopted(buffer.handle)
    pool.settle(3, buffer, given=True)
    assert not os.path.exists(f"/proc/self/fd/{handle.fd}") or \
        os.stat(f"/proc/self/fd/{handle.fd}").st_ino != handle.ino  # ours is closed
    stats = pool.stats()
    assert (stats["given"], stats["bytes"], stats["idle_bytes"]) == (1, 0, 0)
    taker.array[:] = 1  # the taker's memory lives on
    assert pool.take(3, 1024).handle.ino != handle.ino  # never handed out twice


def test_a_discarded_lease_is_closed_not_reused(here):
    pool = shm.BufferPool(here)
    giver = shm.SharedBuffer(512, here)
    lease = pool.adopt(0, giver.handle)
    lease.discard()  # the giver kept writing to it
    del lease
    gc.collect()
    stats = pool.stats()
    assert (stats["closed"], stats["idle_bytes"], stats["bytes"]) == (1, 0, 0)
    assert pool.take(0, 512).handle.ino != giver.handle.ino


def test_a_slot_the_writer_kept_is_never_written_again_and_a_spare_replaces_it(here):
    """The writer adopts a slot's memory (`taken(kept=True)`): the rank drops the slot once it
    is free, and its next slot takes the memory the writer gave back instead of new memory."""
    items, sources = _one_item(256)
    pool = SlotPool()
    slot, _ = pool.acquire(items, sources, may_withdraw=False)
    first = slot.buffers.handle
    exports = SnapshotExports(cond=threading.Condition(), link=None, config=None,
                              exporter=object(), replace_writer=lambda: None)
    payload = slot.buffers.payload([], b"{}")
    with exports._cond:
        _, export_id = exports.offer(SimpleNamespace(session="s", step=1), slot, payload)
    assert exports.taken(export_id, kept=True) and slot.given_away
    slot.release()
    spare = shm.SharedBuffer(first.nbytes, here)
    assert pool.add_spare(spare) and not pool.add_spare(shm.SharedBuffer(first.nbytes, here))
    again, _ = pool.acquire(items, sources, may_withdraw=False)
    assert again is not slot and slot not in pool.slots
    assert again.buffers.handle == spare.handle and again.state is SlotState.FREE
    assert pool.spares == [] and pool.staging_bytes == first.nbytes
    # Not kept (the writer copied it): the slot stays and is reused as it is.
    exports2 = SnapshotExports(cond=threading.Condition(), link=None, config=None,
                               exporter=object(), replace_writer=lambda: None)
    with exports2._cond:
        _, export_id = exports2.offer(SimpleNamespace(session="s", step=2), again, payload)
    assert exports2.taken(export_id) and not again.given_away
    assert pool.acquire(items, sources, may_withdraw=False)[0] is again


def _one_item(nbytes: int):
    model = torch.nn.Linear(nbytes // 4, 1, bias=False)
    captured = capture(model, None)
    items, _ = captured.build_items()
    assert [i.type for i in items] == [WriteItemType.TENSOR]
    tensors, _ = captured.sources(items)
    return items, tensors


def _resident_kb(array: np.ndarray) -> int:
    """This process's resident KB of the mapping that starts at `array`'s first byte (smaps)."""
    start = array.ctypes.data
    with open("/proc/self/smaps", encoding="ascii") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        if line.split("-", 1)[0] == f"{start:x}":
            rss = next(x for x in lines[i + 1:] if x.startswith("Rss:"))
            return int(rss.split()[1])
    raise AssertionError("no mapping starts at the array")


def test_a_buffer_written_elsewhere_is_mapped_populated_and_a_new_one_is_not(here):
    """An adopted buffer or another process's buffer mapped here has its page tables filled by
    the kernel up front (MAP_POPULATE), instead of one fault per page in the copy or write that
    reads it; a new buffer is left to its first writer (populating it would touch all of it on
    the calling thread)."""
    nbytes = 64 * 4096
    giver = shm.SharedBuffer(nbytes, here)
    assert _resident_kb(giver.array) == 0  # new: nothing touched
    giver.array[:] = 5
    adopted = shm.SharedBuffer.adopted(giver.handle)
    assert adopted is not None and _resident_kb(adopted.array) == nbytes // 1024
    for writable in (False, True):
        view = shm.BufferMaps().array(giver.handle, writable=writable)
        assert view is not None and view.flags.writeable == writable
        assert _resident_kb(view) == nbytes // 1024 and int(view[-1]) == 5
    adopted.array[0] = 6  # the adopter may write: the same memory
    assert int(giver.array[0]) == 6
