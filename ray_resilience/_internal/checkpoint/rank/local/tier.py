"""The local tier's files: each rank's newest local steps in two files in node-local shared
memory, so a restart on the same node redoes at most one local interval.

A file is a 4 KiB JSON header and the raw bytes; the header says "writing" until the data is in
and then carries a CRC-32C of the data, so neither a killed writer nor a flipped byte is ever
loaded. Nothing is unpickled. A snapshot is written into a file either from a staging slot
(`write`) or, for a local-only step on CPU, copied straight into the file's mapping
(`begin_direct` / `finish_direct`: no staging memory and no second copy). Format and reasons:
docs/design.md, section 8.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import mmap
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ray_resilience._internal.checkpoint.format.local_roots import hold
from ray_resilience._internal.checkpoint.rank.local import space as local_space
from ray_resilience._internal.checkpoint.shm import POPULATE
from ray_resilience._internal.checkpoint.wire import ShardPayload, aligned_spans, layout_key
from ray_resilience.checkpoint.errors import CheckpointCorruptError

if TYPE_CHECKING:
    from ray_resilience._internal.checkpoint.rank.slots import LocalWrite

logger = logging.getLogger(__name__)

HEADER_BYTES = 4096
FORMAT = "ray_resilience.local/2"
IOV_MAX = 512
"""Buffers per `pwritev` call (Linux allows 1024)."""


class LocalSlot(NamedTuple):
    """A complete snapshot in one of a rank's two files."""

    session: str
    step: int
    layout: str


def layout_digest(items: list) -> str:
    """What a snapshot's shard layout must equal to be read into a rank's state."""
    return hashlib.sha1(repr(layout_key(items)).encode()).hexdigest()


class LocalSnapshots:
    """One rank's two snapshot files. Written by one thread at a time (the pipeline's local
    writer, or the training thread while it loads)."""

    def __init__(self, root: str, rank: int) -> None:
        self.root, self.rank = root, rank
        self._fds: list[int | None] = [None, None]
        self._lock: int | None = None
        """Holds the run folder's lock shared: no cleanup removes it while this rank lives."""
        self._capacity = [0, 0]
        self._maps: list[mmap.mmap | None] = [None, None]
        """Each file's writable mapping (`begin_direct`), as long as its capacity."""
        self._newest: int | None = None
        """The slot this process last wrote or restored from; the next write takes the other."""
        self.disabled: str | None = None
        self.saved = 0
        self.bytes_per_slot = 0

    def write(self, target: LocalWrite, tensors: list[Any], blobs: list[bytes],
              extra: bytes) -> bool:
        """Writes a snapshot (tensor bytes back to back, byte items, extra state) into the file
        not holding the newest one; False when the tier is (or just got) turned off."""
        if self.disabled is not None:
            return False
        buffers = [*tensors, *blobs, extra]
        slot = self._next()
        header = _header(self.rank, target, int(sum(_nbytes(t) for t in tensors)), blobs, extra,
                         align=1)
        try:
            fd = self._file(slot, sum(_nbytes(b) for b in buffers))
            os.pwrite(fd, _encode_header({"format": FORMAT, "state": "writing"}), 0)
            header["crc"] = _write_all(fd, buffers, HEADER_BYTES)
        except OSError as exc:
            self.disable(f"writing {self._path(slot)} failed: {exc}", warn=True)
            return False
        return self._complete(slot, header)

    def begin_direct(self, tensor_bytes: int, other_bytes: int) -> tuple[int, np.ndarray] | None:
        """The file the next snapshot goes to, marked "writing", and its first `tensor_bytes`
        data bytes mapped writable, for the snapshot's tensors to be copied straight in
        (`other_bytes`: its byte items and extra state, written by `finish_direct`). None when
        the tier is (or just got) turned off. Called only while no write is in flight."""
        if self.disabled is not None:
            return None
        slot = self._next()
        try:
            fd = self._file(slot, tensor_bytes + other_bytes)
            os.pwrite(fd, _encode_header({"format": FORMAT, "state": "writing"}), 0)
            mapped = self._maps[slot]
            if mapped is None or len(mapped) != self._capacity[slot]:
                # The files only grow while mapped, so a replaced mapping stays valid for
                # anything still laid over it.
                mapped = self._maps[slot] = mmap.mmap(fd, self._capacity[slot])
        except OSError as exc:
            self.disable(f"mapping {self._path(slot)} failed: {exc}", warn=True)
            return None
        return slot, np.frombuffer(mapped, np.uint8, count=tensor_bytes, offset=HEADER_BYTES)

    def finish_direct(self, target: LocalWrite, slot: int, data: np.ndarray, align: int,
                      blobs: list[bytes], extra: bytes) -> bool:
        """Completes the snapshot whose tensors were copied into `data` (what `begin_direct`
        returned for `slot`, laid out at multiples of `align`): writes the byte items and the
        extra state after it, then the header with the checksum of it all."""
        if self.disabled is not None:
            return False
        fd = self._fds[slot]
        header = _header(self.rank, target, data.nbytes, blobs, extra, align=align)
        try:
            if fd is None:
                raise OSError(errno.EBADF, "the file was closed while the snapshot was copied")
            crc = local_space.checksum(local_space.CHECKSUM, data)
            header["crc"] = _write_all(fd, [*blobs, extra], HEADER_BYTES + data.nbytes, crc)
        except OSError as exc:
            self.disable(f"writing {self._path(slot)} failed: {exc}", warn=True)
            return False
        return self._complete(slot, header)

    def _next(self) -> int:
        """The file not holding the newest snapshot."""
        return 0 if self._newest is None else 1 - self._newest

    def _complete(self, slot: int, header: dict) -> bool:
        try:
            os.pwrite(self._fds[slot], _encode_header(header), 0)
        except OSError as exc:
            self.disable(f"writing {self._path(slot)} failed: {exc}", warn=True)
            return False
        self._newest = slot
        self.saved += 1
        return True

    def capacity_problem(self, size: int, ranks_on_node: int) -> str | None:
        """Why two files of a `size`-byte snapshot for each of `ranks_on_node` ranks would not
        fit in the tmpfs (or the memory limit it is charged to); None when they fit."""
        return local_space.capacity_problem(self.root, slot_bytes(size), ranks_on_node)

    def _file(self, slot: int, size: int) -> int:
        fd = self._fds[slot]
        if fd is not None and self._capacity[slot] >= HEADER_BYTES + size:
            return fd
        if self._lock is None:
            self._lock = hold(self.root)  # creates the folder: private, never via a symlink
        capacity = slot_bytes(size)
        if fd is None:
            fd = os.open(self._path(slot), os.O_RDWR | os.O_CREAT, 0o600)
            self._fds[slot] = fd
        os.pwrite(fd, _encode_header({"format": FORMAT, "state": "writing"}), 0)
        os.posix_fallocate(fd, 0, capacity)  # ENOSPC now rather than a short write later
        self._capacity[slot] = capacity
        self.bytes_per_slot = max(self.bytes_per_slot, capacity)
        return fd

    def _path(self, slot: int) -> str:
        return os.path.join(self.root, f"rank{self.rank}.{slot}")

    def disable(self, why: str, *, warn: bool) -> None:
        """Turns the tier off for this rank (its files are removed), logging `why` once."""
        if self.disabled is not None:
            return
        self.disabled = why
        (logger.warning if warn else logger.info)(
            "rank %d: local snapshot tier off for this run (%s); restarts load committed "
            "checkpoints", self.rank, why)
        self.close(remove=True)

    def slots(self) -> list[LocalSlot]:
        """This rank's complete snapshots, newest first (one header read per file; the data is
        checked when read)."""
        found = [h for h in map(self._read_header, (0, 1)) if h is not None]
        found.sort(key=lambda h: h["step"], reverse=True)
        return [LocalSlot(h["session"], h["step"], h["layout"]) for h in found]

    def available(self, layout: str | None) -> list[tuple[str, int]]:
        """(session, step) of each complete snapshot with shard layout `layout` (None: any)."""
        return [(s, step) for s, step, digest in self.slots() if layout in (None, digest)]

    @contextlib.contextmanager
    def read(self, session: str, step: int, layout: str,
             tensor_sizes: list[int]) -> Iterator[ShardPayload | None]:
        """The snapshot of (`session`, `step`) as a `ShardPayload` laid out by the reader's plan,
        over the file mapped read-only: nothing is copied but what the caller loads. None when
        no file holds it; `CheckpointCorruptError` when its file fails a check, or on leaving
        when it was rewritten while the caller copied from it (a stale writer: a hung rank not
        yet gone), so what the caller loaded is torn and must not be used."""
        for slot in (0, 1):
            header = self._read_header(slot)
            if header is None or (header["session"], header["step"], header["layout"]) \
                    != (session, step, layout):
                continue
            where = self._path(slot)
            expected = aligned_spans(tensor_sizes, header["align"])[1]
            if header["tensor_bytes"] != expected:
                raise CheckpointCorruptError(where, f"holds {header['tensor_bytes']} tensor "
                                                    f"bytes, the save plan has {expected}")
            yield _payload(self._map_data(where, header), tensor_sizes, header)
            # A write marks the header "writing" first and stamps a new time when done: an
            # unchanged header means no byte changed since the checksum was taken.
            if self._read_header(slot) != header:
                raise CheckpointCorruptError(where, "the file was rewritten while it was read")
            self._newest = slot
            return
        yield None

    def _map_data(self, where: str, header: dict) -> np.ndarray:
        """The file's data, mapped read-only (page-cache pages of the tmpfs: no allocation and
        no copy, which at GBs cost more than the read), its checksum checked."""
        length = header["tensor_bytes"] + sum(header["blobs"]) + header["extra"]
        with open(where, "rb", buffering=0) as f:
            if HEADER_BYTES + length > os.fstat(f.fileno()).st_size:
                raise CheckpointCorruptError(where, "the header claims more bytes than the file "
                                                    "holds (unreadable)")
            if length == 0:
                return np.empty(0, np.uint8)
            # The files only grow (fallocate) and are unlinked, never truncated, while a rank
            # may read them, so the mapping cannot lose pages under the reader.
            mapped = mmap.mmap(f.fileno(), HEADER_BYTES + length, prot=mmap.PROT_READ,
                               flags=mmap.MAP_SHARED | POPULATE)  # every page is read next
        data = np.frombuffer(mapped, np.uint8, count=length, offset=HEADER_BYTES)
        actual = local_space.checksum(header["checksum"], data)
        if actual != header["crc"]:
            raise CheckpointCorruptError(where, f"{header['checksum']} of the data is "
                                                f"{actual:#010x}, the header says "
                                                f"{header['crc']:#010x}")
        return data

    def keep_only(self, session: str | None, step: int | None) -> None:
        """Marks every other snapshot incomplete: after a restore, no file of the abandoned
        timeline may be taken for one of the new."""
        kept = None
        for slot in (0, 1):
            header = self._read_header(slot)
            if header is None:
                continue
            if (header["session"], header["step"]) == (session, step):
                kept = slot
                continue
            try:
                fd = self._fds[slot]
                if fd is None:
                    fd = self._fds[slot] = os.open(self._path(slot), os.O_RDWR)
                os.pwrite(fd, _encode_header({"format": FORMAT, "state": "invalid"}), 0)
            except OSError as exc:
                self.disable(f"invalidating {self._path(slot)} failed: {exc}", warn=True)
                return
        self._newest = kept  # the next write takes the other file

    def _read_header(self, slot: int) -> dict | None:
        try:
            with open(self._path(slot), "rb", buffering=0) as f:
                raw = f.read(HEADER_BYTES)
        except OSError:
            return None
        header = _decode_header(raw)
        if header is None or header.get("state") != "complete" or header.get("rank") != self.rank:
            return None
        try:
            header["session"], header["step"] = str(header["session"]), int(header["step"])
            header["layout"] = str(header["layout"])
            header.setdefault("align", 1)  # written by a staging slot's copy, back to back
            counts = (header["tensor_bytes"], header["extra"], header["crc"], *header["blobs"])
            if not all(isinstance(n, int) and n >= 0 for n in counts) \
                    or not isinstance(header["align"], int) or header["align"] < 1 \
                    or not local_space.known_checksum(header["checksum"]):
                return None
        except (KeyError, TypeError, ValueError):
            return None
        return header

    def stats(self) -> dict[str, Any]:
        return {"local_snapshots": self.saved, "local_bytes": 2 * self.bytes_per_slot,
                "local_disabled": self.disabled}

    def close(self, *, remove: bool = False) -> None:
        self._maps = [None, None]  # unmapped once nothing laid over them is left
        for slot, fd in enumerate(self._fds):
            if fd is not None:
                os.close(fd)
                self._fds[slot] = None
            if remove:
                try:
                    os.unlink(self._path(slot))
                except OSError:
                    pass
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def slot_bytes(size: int) -> int:
    """A file's allocation for `size` bytes of snapshot: room for the extra state to grow."""
    return HEADER_BYTES + size + size // 8 + 65536


def _nbytes(buffer: Any) -> int:
    return buffer.nbytes if isinstance(buffer, np.ndarray) else len(memoryview(buffer).cast("B"))


def _header(rank: int, target: LocalWrite, tensor_bytes: int, blobs: list[bytes],
            extra: bytes, *, align: int) -> dict[str, Any]:
    return {"format": FORMAT, "state": "complete", "rank": rank,
            "session": target.session, "step": int(target.step), "layout": target.layout,
            "tensor_bytes": tensor_bytes, "align": align, "blobs": [len(b) for b in blobs],
            "extra": len(extra), "checksum": local_space.CHECKSUM, "time": time.time()}


def _payload(data: np.ndarray, tensor_sizes: list[int], header: dict) -> ShardPayload:
    at = header["tensor_bytes"]
    blobs = []
    for n in header["blobs"]:
        blobs.append(data[at:at + n].tobytes())
        at += n
    return ShardPayload.packed(data, tensor_sizes, blobs, data[at:at + header["extra"]].tobytes(),
                               align=header["align"])


def _write_all(fd: int, buffers: list, offset: int, crc: int = 0) -> int:
    """pwritev of every buffer at `offset`, resuming after short writes; returns the checksum
    of what was written (continuing `crc`)."""
    pending = [memoryview(b).cast("B") for b in buffers if _nbytes(b)]
    for view in pending:
        crc = local_space.checksum(local_space.CHECKSUM, view, crc)
    while pending:
        batch = pending[:IOV_MAX]
        written = os.pwritev(fd, batch, offset)
        if written <= 0:
            raise OSError(errno.EIO, "pwritev wrote nothing")
        offset += written
        rest = written
        while pending and rest >= len(pending[0]):
            rest -= len(pending.pop(0))
        if rest:
            pending[0] = pending[0][rest:]
    return crc


def _encode_header(header: dict) -> bytes:
    data = json.dumps(header, separators=(",", ":")).encode()
    if len(data) + 8 > HEADER_BYTES:
        raise OSError(errno.EOVERFLOW, f"local snapshot header of {len(data)} bytes does not fit "
                                       f"in {HEADER_BYTES}")
    return len(data).to_bytes(8, "little") + data + b"\0" * (HEADER_BYTES - 8 - len(data))


def _decode_header(raw: bytes) -> dict | None:
    if len(raw) < 8:
        return None
    n = int.from_bytes(raw[:8], "little")
    if n <= 0 or n > HEADER_BYTES - 8:
        return None
    try:
        header = json.loads(raw[8:8 + n])
    except (ValueError, UnicodeDecodeError):
        return None
    return header if isinstance(header, dict) and header.get("format") == FORMAT else None
