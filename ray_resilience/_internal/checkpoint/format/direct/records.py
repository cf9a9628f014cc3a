"""A committed step's large tensors loaded straight into the model's and optimizer's own memory:
each item's `torch.save` record is located in the rank's data file (its zip directory, read
from the record's two ends), its tensor bytes are read into the target (`DirectSource`), and
the whole record is checked against the items file's CRC. A restore of GBs then takes no page
cache, no whole-file buffer and no second copy, and unpickles nothing: dtype and shape are
the checkpoint metadata's, already checked against the target by DCP's planner.
"""

from __future__ import annotations

import functools
import io
import struct
import zipfile
from typing import Any

import torch
from torch.distributed.checkpoint.planner import LoadPlanner, ReadItem

from ray_resilience._internal.checkpoint.format import checksum
from ray_resilience._internal.checkpoint.format.direct.files import DirectSource
from ray_resilience.checkpoint.errors import CheckpointCorruptError

MIN_BYTES = 2**20
"""Smaller items load through `torch.load` (few bytes: not worth a record walk)."""
_EDGE = 64 * 2**10
"""Bytes read from each end of a record: its zip headers and directory."""
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")
"""A zip local file header (30 bytes; the name and extra-field lengths are its last two)."""


class DirectItems:
    """Loads the qualifying items of one data file; `count` says how many it loaded."""

    def __init__(self, source: DirectSource, where: str,
                 table: dict[int, tuple[int, str, int]]) -> None:
        self._source, self.where, self._table = source, where, table
        self.count = 0

    def load(self, req: ReadItem, offset: int, length: int, dtype: torch.dtype,
             planner: LoadPlanner) -> bool:
        """Loads `req` (its record at `offset`, `length` bytes) into its target; False, having
        changed nothing, when it does not qualify: under `MIN_BYTES`, part of a stored chunk,
        a target that is not contiguous CPU memory of `dtype`, or a record of another shape."""
        expected = self._table.get(offset)
        if length < MIN_BYTES or expected is None or expected[0] != length \
                or any(req.storage_offsets):
            return False
        target = planner.resolve_tensor(req).detach()
        if target.device.type != "cpu" or target.dtype != dtype or not target.is_contiguous() \
                or list(target.size()) != list(req.lengths):
            return False
        nbytes = target.numel() * target.element_size()
        record = _Record(self._source, offset, length)
        span = record.data_span(nbytes)
        if span is None:
            return False
        fn = functools.partial(checksum.checksum, expected[1])
        value = fn(record.head[:span[0]])
        dest = memoryview(target.reshape(-1).view(torch.uint8).numpy())
        value = self._source.read_into(offset + span[0], dest, checksum=fn, value=value)
        value = fn(record.tail[len(record.tail) - (length - span[1]):], value)
        if value != expected[2]:
            raise CheckpointCorruptError(self.where, (
                f"{req.storage_index.fqn}: {expected[1]} of the {length} bytes at {offset} is "
                f"{value:#010x}, the items file says {expected[2]:#010x}"))
        planner.commit_tensor(req, target)
        self.count += 1
        return True


class _Record(io.RawIOBase):
    """One `torch.save` record of a data file as a seekable stream for `zipfile`, served from
    its first and last `_EDGE` bytes (read once) and the file for anything between."""

    def __init__(self, source: DirectSource, offset: int, length: int) -> None:
        super().__init__()
        self._source, self._offset, self._length, self._pos = source, offset, length, 0
        edge = min(_EDGE, length)
        self.head = source.read(offset, edge)
        self.tail = source.read(offset + length - edge, edge)

    def data_span(self, nbytes: int) -> tuple[int, int] | None:
        """(start, end) of the tensor bytes within the record, or None unless the record holds
        one stored (uncompressed) storage of `nbytes` with its headers within head and tail."""
        try:
            entries = [i for i in zipfile.ZipFile(self).infolist()
                       if i.filename.rsplit("/", 2)[-2:-1] == ["data"]]
        except (zipfile.BadZipFile, OSError, ValueError):
            return None
        if len(entries) != 1 or entries[0].compress_type != zipfile.ZIP_STORED \
                or entries[0].file_size != nbytes:
            return None
        at = entries[0].header_offset
        if at + _LOCAL_HEADER.size > len(self.head):
            return None
        fields = _LOCAL_HEADER.unpack_from(self.head, at)
        start = at + _LOCAL_HEADER.size + fields[-2] + fields[-1]
        end = start + nbytes
        if fields[0] != b"PK\x03\x04" or start > len(self.head) \
                or not self._length - len(self.tail) <= end <= self._length:
            return None
        return start, end

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def readinto(self, out: Any) -> int:
        view = memoryview(out).cast("B")
        n = max(0, min(len(view), self._length - self._pos))
        start, end = self._pos, self._pos + n
        tail_at = self._length - len(self.tail)
        if end <= len(self.head):
            view[:n] = self.head[start:end]
        elif start >= tail_at:
            view[:n] = self.tail[start - tail_at:end - tail_at]
        elif n:
            self._source.read_into(self._offset + start, view[:n])
        self._pos = end
        return n
