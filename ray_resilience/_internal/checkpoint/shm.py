"""Shared memory between the ranks and the checkpoint writer of a node, reused from save to save.

A save hands the rank's snapshot to its writer, and the writer keeps the newest committed one as
the memory tier. Handed over in a new object-store object each time, every save touched about
its state size of memory not used before, which a virtual machine may charge up to ~80x a reused
page (docs/design.md, section 7), and the rank paid a memcpy into it. Here both sides hold
`SharedBuffer`s (`memfd_create`: anonymous shared memory that lives while a process holds its
file or a mapping, and never shows up in a folder, so nothing is left behind when they die).
A rank stages each snapshot into a slot (`rank/snapshot.py`); at the hand-off the writer adopts
the slot's memory (`BufferPool.adopt`: a file of its own on the same memory, no copy) and the
rank drops the slot. A buffer goes back to the writer's pool when nothing uses it any more (the
shard was written and, with the memory tier, a newer commit replaced it); the writer then offers
it back to the rank (`BufferPool.claim` / `settle`), which adopts it for its next slot, so the
same two or three buffers per rank serve save after save. Where the writer cannot adopt a slot
it maps it and copies it into a buffer of its own; where the slot is not shared (pinned memory
on GPU) the rank copies into the buffer the writer lends (`BufferMaps.fill`).

A process on the same node maps another's buffer through `/proc/<pid>/fd/<fd>` and checks that
the file it opened is the buffer (device, inode and size); anything else (another node, another
pid namespace) refuses and the caller takes the object-store path.
"""

from __future__ import annotations

import collections
import dataclasses
import mmap
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import ray

MAX_FREE_PER_KEY = 1
"""Idle buffers a writer keeps per rank for the next save (more are closed)."""
MAX_MAPS_PER_OWNER = 4
"""Buffers of one other process that a process keeps mapped: a GPU rank fills at most three of
its writer's (the save in flight, a durable save waiting for its commit, the memory tier), a
loader maps the memory tier, and a writer maps a rank's slots only where it cannot adopt them
(`BufferPool.adopt` opens a file of its own instead of a mapping kept here)."""
MAX_MAPS = 16
POPULATE = getattr(mmap, "MAP_POPULATE", 0)
"""Mapping a buffer another process wrote, the kernel fills the page tables up front: its pages
exist, and faulting them in one by one as the copy or the write reaches them made a 1 GB copy
through a new mapping cost 0.28 CPU-s on the benchmark machine, populated 0.16
(`jobs/bench/overhead/map_cost.py`; docs/design.md, section 7). Never for a buffer this process
creates: that would touch every page of it on the calling thread (the slot's first copy does
that, in the background). A lent buffer mapped to be filled whole (`BufferMaps.fill`) is
populated too: the fill touches every page on that same thread anyway."""


@dataclasses.dataclass(frozen=True)
class BufferHandle:
    """Where a process on the writer's node finds one of its buffers (picklable)."""

    node_id: str
    pid: int
    fd: int
    dev: int
    ino: int
    nbytes: int

    @property
    def path(self) -> str:
        return f"/proc/{self.pid}/fd/{self.fd}"


class SharedBuffer:
    """`nbytes` of shared memory this process owns, mapped writable (`array`), that a process on
    its node can map by `handle`. Its memory goes once this object and every mapping are gone."""

    def __init__(self, nbytes: int, node_id: str | None, *, fd: int | None = None) -> None:
        """A new buffer; with `fd` (an open file of a buffer, which this object then owns), that
        buffer."""
        adopting = fd is not None
        if fd is None:
            fd = os.memfd_create("ray_resilience-checkpoint", os.MFD_CLOEXEC)
        try:
            if not os.fstat(fd).st_size:
                os.ftruncate(fd, nbytes)
            # An existing buffer (adopted: written by its giver) is mapped populated.
            flags = mmap.MAP_SHARED | (POPULATE if adopting else 0)
            mapping = mmap.mmap(fd, nbytes, flags=flags) if nbytes else None
            info = os.fstat(fd)
        except BaseException:
            os.close(fd)
            raise
        self.handle = BufferHandle(node_id or "", os.getpid(), fd, info.st_dev, info.st_ino,
                                   nbytes)
        self.array = (np.frombuffer(mapping, dtype=np.uint8) if mapping is not None
                      else np.empty(0, np.uint8))
        self.reusable = True
        """False once its bytes may be in use elsewhere: never reused (closed when let go)."""
        self._closer = weakref.finalize(self, _close, fd, mapping)

    @classmethod
    def adopted(cls, handle: BufferHandle) -> SharedBuffer | None:
        """The buffer `handle` names (another process's on this node), owned by this process
        from now on through a file of its own: its memory stays while either process holds it.
        None where it cannot be opened here (as `BufferMaps.array`). The giver must stop
        writing to it: the adopter reuses it for its own ends."""
        if handle.node_id != node_here() or not handle.nbytes:
            return None
        try:
            fd = os.open(handle.path, os.O_RDWR)
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            if (info.st_dev, info.st_ino, info.st_size) != (handle.dev, handle.ino, handle.nbytes):
                os.close(fd)
                return None
            return cls(handle.nbytes, handle.node_id, fd=fd)
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        """Closes the file now (the memory goes once no mapping is left)."""
        self.array = None
        self._closer()


def _close(fd: int, mapping: mmap.mmap | None) -> None:
    os.close(fd)
    if mapping is not None:
        try:
            mapping.close()
        except BufferError:  # a view is still alive somewhere: unmapped when it goes
            pass


class Lease:
    """One buffer, lent to a shard until this object is garbage (then back to the pool)."""

    def __init__(self, buffer: SharedBuffer) -> None:
        self.handle = buffer.handle
        self.array = buffer.array
        """The buffer's bytes, writable (the writer's own mapping)."""
        self._buffer = buffer

    def discard(self) -> None:
        """Its buffer is closed when let go, never reused (another process may still write it)."""
        self._buffer.reusable = False


class BufferPool:
    """A writer's buffers, by key (a rank, or a replica of one); thread-safe. Leases return their
    buffer when garbage-collected, so no holder has to remember to give it back."""

    def __init__(self, node_id: str, on_idle: Callable[[Any], None] | None = None) -> None:
        self._node_id = node_id
        self._on_idle = on_idle
        """Called (outside the lock, from whatever thread let the lease go) with a key that has
        an idle buffer now; it must not block."""
        self._lock = threading.Lock()
        self._free: dict[Any, collections.deque[SharedBuffer]] = collections.defaultdict(
            collections.deque)
        self._counts = {"created": 0, "reused": 0, "closed": 0, "leased": 0, "adopted": 0,
                        "given": 0}
        self._bytes = 0
        """Bytes of every open buffer (leased or idle)."""

    def take(self, key: Any, nbytes: int) -> Lease:
        """A buffer of exactly `nbytes` for `key`: an idle one of that size, else a new one."""
        with self._lock:
            free = self._free[key]
            for buffer in list(free):
                if buffer.handle.nbytes == nbytes:
                    free.remove(buffer)
                    self._counts["reused"] += 1
                    break
            else:
                buffer = None
        if buffer is None:
            buffer = self._create(nbytes)
        lease = Lease(buffer)
        with self._lock:
            self._counts["leased"] += 1
        weakref.finalize(lease, self._give_back, key, buffer)
        return lease

    def adopt(self, key: Any, handle: BufferHandle) -> Lease | None:
        """Another process's buffer (`SharedBuffer.adopted`), leased to `key` and pooled like one
        of ours when let go; None where it cannot be opened here."""
        buffer = SharedBuffer.adopted(handle)
        if buffer is None:
            return None
        lease = Lease(buffer)
        with self._lock:
            self._counts["adopted"] += 1
            self._counts["leased"] += 1
            self._bytes += buffer.handle.nbytes
        weakref.finalize(lease, self._give_back, key, buffer)
        return lease

    def claim(self, key: Any) -> SharedBuffer | None:
        """An idle buffer of `key`, out of the pool until `settle`; None when there is none."""
        with self._lock:
            free = self._free.get(key)
            return free.popleft() if free else None

    def settle(self, key: Any, buffer: SharedBuffer, *, given: bool) -> None:
        """A `claim`ed buffer: `given` away (another process adopted it: ours is closed), else
        idle again."""
        if not given:
            self._give_back(key, buffer, notify=False)
            return
        with self._lock:
            self._counts["given"] += 1
            self._bytes -= buffer.handle.nbytes
        buffer.close()

    def _create(self, nbytes: int) -> SharedBuffer:
        buffer = SharedBuffer(nbytes, self._node_id)
        with self._lock:
            self._counts["created"] += 1
            self._bytes += nbytes
        return buffer

    def _give_back(self, key: Any, buffer: SharedBuffer, *, notify: bool = True) -> None:
        with self._lock:
            free = self._free[key]
            keep = buffer.reusable and len(free) < MAX_FREE_PER_KEY
            if keep:
                free.append(buffer)
            else:
                self._counts["closed"] += 1
                self._bytes -= buffer.handle.nbytes
        if not keep:
            buffer.close()
        elif notify and self._on_idle is not None:
            self._on_idle(key)

    def stats(self) -> dict[str, int]:
        with self._lock:
            idle = sum(b.handle.nbytes for q in self._free.values() for b in q)
            return {**self._counts, "bytes": self._bytes, "idle_bytes": idle}


class BufferMaps:
    """This process's mappings of other processes' buffers, newest last: at most
    `MAX_MAPS_PER_OWNER` per process and none of a process that is gone (a mapping keeps the
    memory alive). Kept so that a reused buffer is not mapped again: mapping the same pages is
    cheap, but its page tables are built anew."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._maps: collections.OrderedDict[BufferHandle, np.ndarray] = collections.OrderedDict()

    def array(self, handle: BufferHandle, *, writable: bool) -> np.ndarray | None:
        """The buffer's bytes mapped in this process; None where it cannot be opened here (another
        node or pid namespace, the writer gone, or the file is not the buffer)."""
        if handle.node_id != node_here():
            return None
        with self._lock:
            held = self._maps.get(handle)
            if held is not None and (held.flags.writeable or not writable):
                self._maps.move_to_end(handle)
                return held
        try:
            fd = os.open(handle.path, os.O_RDWR if writable else os.O_RDONLY)
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            if (info.st_dev, info.st_ino, info.st_size) != (handle.dev, handle.ino, handle.nbytes):
                return None
            if not handle.nbytes:
                return np.empty(0, np.uint8)
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            mapping = mmap.mmap(fd, handle.nbytes, flags=mmap.MAP_SHARED | POPULATE, prot=prot)
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)
        array = np.frombuffer(mapping, dtype=np.uint8)
        with self._lock:
            self._maps[handle] = array
            for old in [h for h in self._maps if not os.path.exists(f"/proc/{h.pid}")]:
                del self._maps[old]  # its process is gone: let its memory go
            same = [h for h in self._maps if h.pid == handle.pid]
            for old in same[:-MAX_MAPS_PER_OWNER]:
                del self._maps[old]
            while len(self._maps) > MAX_MAPS:
                self._maps.popitem(last=False)
        return array

    def fill(self, handle: BufferHandle, data: np.ndarray) -> bool:
        """Copies `data` (uint8, exactly the buffer's size) into the buffer; False when it cannot
        be mapped here. The copy releases the GIL."""
        if data.nbytes != handle.nbytes:
            raise ValueError(f"a snapshot of {data.nbytes} bytes cannot fill a buffer of "
                             f"{handle.nbytes}")
        target = self.array(handle, writable=True)
        if target is None:
            return False
        np.copyto(target, data.reshape(-1).view(np.uint8))
        return True

    def clear(self) -> None:
        with self._lock:
            self._maps.clear()


def node_here() -> str | None:
    """This process's Ray node id (None outside Ray; never starts one)."""
    if not ray.is_initialized():
        return None
    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - not connected to Ray: no node to share memory on
        return None


MAPS = BufferMaps()
"""This process's mappings (one per process: ranks and loaders share it)."""
