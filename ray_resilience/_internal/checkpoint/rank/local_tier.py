"""The local tier: each rank's state at every local step in one of two files in node-local
shared memory, so a restart on the same node redoes at most one step.

A file is a 4 KiB JSON header and the raw bytes; the header says "writing" until the data is in,
so a killed writer leaves a file that is recognisably incomplete. Nothing is unpickled. Format
and reasons: docs/design.md, section 8.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import logging
import os
import time
from typing import Any

import numpy as np

from ray_resilience._internal.checkpoint.format.local_roots import hold
from ray_resilience._internal.checkpoint.wire import ShardPayload, layout_key

logger = logging.getLogger(__name__)

HEADER_BYTES = 4096
FORMAT = "ray_resilience.local/1"
IOV_MAX = 512
"""Buffers per `pwritev` call (Linux allows 1024)."""


@dataclasses.dataclass(frozen=True)
class LocalSlot:
    """A complete snapshot in one of a rank's two files."""

    slot: int
    session: str
    step: int
    layout: str


def layout_digest(items: list) -> str:
    """What a snapshot's shard layout must equal to be read into a rank's state."""
    return hashlib.sha1(repr(layout_key(items)).encode()).hexdigest()


class LocalSnapshots:
    """One rank's two snapshot files. Used from the rank's training thread only."""

    def __init__(self, root: str, rank: int, *, max_bytes: int | None) -> None:
        self.root, self.rank, self.max_bytes = root, rank, max_bytes
        self._fds: list[int | None] = [None, None]
        self._lock: int | None = None
        """Holds the run folder's lock shared: no cleanup removes it while this rank lives."""
        self._capacity = [0, 0]
        self._newest: int | None = None
        """The slot this process last wrote or restored from; the next write takes the other."""
        self._views_key: Any = None
        self._views: list[np.ndarray] = []
        self._digests: dict[int, tuple[Any, str]] = {}
        self.disabled: str | None = None
        self.saved = 0
        self.bytes_per_slot = 0


    def save(self, step: int, session: str, source: Any, extra: bytes) -> bool:
        """Writes `source` (a `SaveSource`) and `extra` as the snapshot of `step`; False when the
        tier is (or just got) turned off."""
        if self.disabled is not None:
            return False
        if self.max_bytes is not None and source.tensor_bytes > self.max_bytes:
            self._disable(f"this rank's state is {source.tensor_bytes} bytes, over "
                          f"CheckpointConfig.local_max_bytes={self.max_bytes}; raise it (and maybe "
                          "local_interval_steps) to keep a local snapshot", warn=False)
            return False
        views = self._tensor_views(source)
        buffers = [*views, *source.blobs, extra]
        size = sum(b.nbytes if isinstance(b, np.ndarray) else len(b) for b in buffers)
        slot = 0 if self._newest is None else 1 - self._newest
        header = {"format": FORMAT, "state": "complete", "rank": self.rank, "session": session,
                  "step": int(step), "layout": self._digest(source.items),
                  "tensor_bytes": int(source.tensor_bytes), "blobs": [len(b) for b in source.blobs],
                  "extra": len(extra), "time": time.time()}
        try:
            fd = self._file(slot, size)
            os.pwrite(fd, _encode_header({"format": FORMAT, "state": "writing"}), 0)
            _write_all(fd, buffers, HEADER_BYTES)
            os.pwrite(fd, _encode_header(header), 0)
        except OSError as exc:
            self._disable(f"writing {self._path(slot)} failed: {exc}", warn=True)
            return False
        self._newest = slot
        self.saved += 1
        return True

    def _tensor_views(self, source: Any) -> list[np.ndarray]:
        """Flat uint8 views of the live tensors (built once per plan)."""
        if self._views_key is not None and self._views_key[0] is source.tensors:
            return self._views
        views = []
        for tensor in source.tensors:
            t = tensor.detach()
            if t.device.type != "cpu" or not t.is_contiguous() or t.is_conj() or t.is_neg():
                views = None  # copied at every save: no view of these stays current
                break
            views.append(t.reshape(-1).view(_uint8()).numpy() if t.numel()
                         else np.empty(0, np.uint8))
        if views is None:
            return [t.detach().resolve_conj().resolve_neg().contiguous().cpu().reshape(-1)
                    .view(_uint8()).numpy() for t in source.tensors]
        self._views_key, self._views = (source.tensors,), views
        return views

    def _digest(self, items: list) -> str:
        cached = self._digests.get(id(items))
        if cached is None or cached[0] is not items:
            cached = self._digests[id(items)] = (items, layout_digest(items))
        return cached[1]

    def _file(self, slot: int, size: int) -> int:
        fd = self._fds[slot]
        if fd is not None and self._capacity[slot] >= HEADER_BYTES + size:
            return fd
        if self._lock is None:
            self._lock = hold(self.root)  # creates the folder: private, never via a symlink
        capacity = HEADER_BYTES + size + size // 8 + 65536  # room for extra state to grow
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

    def _disable(self, why: str, *, warn: bool) -> None:
        self.disabled = why
        (logger.warning if warn else logger.info)(
            "rank %d: local snapshot tier off for this run (%s); restarts load committed "
            "checkpoints", self.rank, why)
        self.close(remove=warn)


    def slots(self) -> list[LocalSlot]:
        """This rank's complete snapshots (one header read per file)."""
        return [found[0] for found in map(self._read_header, (0, 1)) if found is not None]

    def available(self, layout: str | None) -> list[tuple[str, int]]:
        """(session, step) of each complete snapshot with shard layout `layout` (None: any)."""
        return [(s.session, s.step) for s in self.slots() if layout in (None, s.layout)]

    def read(self, session: str, step: int, layout: str, tensor_sizes: list[int]) -> Any | None:
        """The snapshot of (`session`, `step`) as a `ShardPayload` laid out by the reader's plan,
        or None when no file holds it intact."""
        for slot in (0, 1):
            found = self._read_header(slot)
            if found is None:
                continue
            info, header = found
            if (info.session, info.step, info.layout) != (session, step, layout):
                continue
            if header["tensor_bytes"] != sum(tensor_sizes):
                return None
            length = header["tensor_bytes"] + sum(header["blobs"]) + header["extra"]
            with open(self._path(slot), "rb", buffering=0) as f:
                if HEADER_BYTES + length > os.fstat(f.fileno()).st_size:
                    return None  # a header that claims more than the file holds
                data = bytearray(length)
                f.seek(HEADER_BYTES)
                if f.readinto(data) != length:
                    return None
            again = self._read_header(slot)  # a stale writer (a hung rank not yet gone)?
            if again is None or again[1] != header:
                return None
            at = sum(tensor_sizes)
            blobs = []
            for n in header["blobs"]:
                blobs.append(bytes(data[at:at + n]))
                at += n
            self._newest = slot
            return ShardPayload.packed(np.frombuffer(data, np.uint8), tensor_sizes, blobs,
                                       bytes(data[at:at + header["extra"]]))
        return None

    def keep_only(self, session: str | None, step: int | None) -> None:
        """Marks every other snapshot incomplete: after a restore, no file of the abandoned
        timeline may be taken for one of the new."""
        kept = None
        for slot in (0, 1):
            found = self._read_header(slot)
            if found is not None and (found[0].session, found[0].step) == (session, step):
                kept = slot
                continue
            if found is None:
                continue
            try:
                fd = self._fds[slot]
                if fd is None:
                    fd = self._fds[slot] = os.open(self._path(slot), os.O_RDWR)
                os.pwrite(fd, _encode_header({"format": FORMAT, "state": "invalid"}), 0)
            except OSError as exc:
                self._disable(f"invalidating {self._path(slot)} failed: {exc}", warn=True)
                return
        self._newest = kept  # the next write takes the other file

    def _read_header(self, slot: int) -> tuple[LocalSlot, dict] | None:
        try:
            with open(self._path(slot), "rb", buffering=0) as f:
                raw = f.read(HEADER_BYTES)
        except OSError:
            return None
        header = _decode_header(raw)
        if header is None or header.get("state") != "complete" or header.get("rank") != self.rank:
            return None
        try:
            info = LocalSlot(slot, str(header["session"]), int(header["step"]),
                             str(header["layout"]))
            if not all(isinstance(n, int) and n >= 0 for n in
                       (header["tensor_bytes"], header["extra"], *header["blobs"])):
                return None
        except (KeyError, TypeError, ValueError):
            return None
        return info, header


    def stats(self) -> dict[str, Any]:
        return {"local_snapshots": self.saved, "local_bytes": 2 * self.bytes_per_slot,
                "local_disabled": self.disabled}

    def close(self, *, remove: bool = False) -> None:
        for slot, fd in enumerate(self._fds):
            if fd is not None:
                os.close(fd)
                self._fds[slot] = None
                if remove:
                    try:
                        os.unlink(self._path(slot))
                    except OSError:
                        pass
        self._views_key, self._views = None, []
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def _write_all(fd: int, buffers: list, offset: int) -> None:
    """pwritev of every buffer at `offset`, resuming after short writes."""
    pending = [memoryview(b).cast("B") for b in buffers if len(memoryview(b).cast("B"))]
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


def _uint8() -> Any:
    import torch  # noqa: PLC0415 - writers import this module without needing torch

    return torch.uint8
