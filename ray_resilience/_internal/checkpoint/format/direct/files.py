"""A local checkpoint data file written with O_DIRECT: bytes go from a reused, page-aligned
buffer straight to the device, never through the page cache.

A buffered write of a GB-sized shard first takes a GB of page cache (new memory, which a busy
node pays for in CPU time and in memory taken from training) and copies into it; dropping the
pages after the fsync only limits how long they stay. O_DIRECT skips both (docs/design.md,
section 7). What it costs instead is a copy into the aligned buffer, since torch.save places
each record at an offset of its own choosing. Lustre (FSx), XFS, ext4 and EBS volumes take
O_DIRECT; tmpfs and some FUSE or NFS mounts refuse it, at open or at the first write, and the
file is then written buffered like any other.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import mmap
import os
from typing import Any

logger = logging.getLogger(__name__)

BLOCK = 4096
"""Alignment of every direct write's offset, length and memory (a page: what Lustre asks)."""
BUFFER_BYTES = 8 * 2**20
"""The copy buffer: large enough that a write costs little more than its bytes."""

_refused_folders: set[str] = set()
"""Folders whose file system refused O_DIRECT (logged once each)."""


class DirectFile:
    """A write-only file stream (`write`, `tell`, `close`) that replaces `path`. Direct while
    the file system takes it, buffered from the first refusal on; fsync'ed on `close`. Not
    thread-safe: one writer thread per file."""

    def __init__(self, path: str) -> None:
        self.path = path
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        self.direct = hasattr(os, "O_DIRECT")
        try:
            self._fd = os.open(path, flags | (os.O_DIRECT if self.direct else 0), 0o644)
        except OSError as exc:
            if not self.direct or exc.errno != errno.EINVAL:
                raise
            self.direct = _refused(self.path, exc)
            self._fd = os.open(path, flags, 0o644)
        self._buffer = mmap.mmap(-1, BUFFER_BYTES)  # anonymous: page-aligned
        self._view = memoryview(self._buffer)
        self._filled = 0
        self._offset = 0
        """File offset of the buffer's first byte: always a multiple of BLOCK."""

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            take = min(BUFFER_BYTES - self._filled, len(view) - done)
            self._view[self._filled:self._filled + take] = view[done:done + take]
            self._filled += take
            done += take
            if self._filled == BUFFER_BYTES:
                self._flush(BUFFER_BYTES)
        return done

    def tell(self) -> int:
        return self._offset + self._filled

    def flush(self) -> None:
        """Nothing: only whole blocks may be written before `close`."""

    def close(self) -> None:
        """Writes the tail (padded to a block, then cut back to the true size) and fsyncs."""
        if self._fd < 0:
            return
        try:
            size = self.tell()
            if self._filled:
                self._flush(-(-self._filled // BLOCK) * BLOCK)
            os.ftruncate(self._fd, size)
            os.fsync(self._fd)
            if not self.direct and hasattr(os, "posix_fadvise"):
                os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            self.abort()

    def abort(self) -> None:
        """Closes without finishing (the file is left torn: the caller rewrites or removes it)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._view.release()
        with contextlib.suppress(BufferError):  # still exported: freed with its last reference
            self._buffer.close()

    def __enter__(self) -> DirectFile:
        return self

    def __exit__(self, kind: Any, *rest: Any) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()

    def _flush(self, length: int) -> None:
        """Writes the buffer's first `length` bytes (a block multiple) at `_offset`."""
        done = 0
        while done < length:
            chunk = self._view[done:length]
            try:
                done += os.pwrite(self._fd, chunk, self._offset + done)
            except OSError as exc:
                if not self.direct or exc.errno != errno.EINVAL:
                    raise
                self.direct = _stop_direct(self._fd, self.path, exc)  # some FUSE and NFS mounts
            finally:
                chunk.release()  # an error's traceback must not pin the buffer open
        self._offset += min(length, self._filled)
        self._filled = 0


class DirectSource:
    """A local file read with O_DIRECT through a reused, page-aligned buffer and copied where
    the caller wants it (a tensor's own memory): a restore takes no page cache and no
    whole-file buffer. Buffered (its pages dropped on `close`) where O_DIRECT is refused."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.direct = hasattr(os, "O_DIRECT")
        flags = os.O_RDONLY | os.O_CLOEXEC
        try:
            self._fd = os.open(path, flags | (os.O_DIRECT if self.direct else 0))
        except OSError as exc:
            if not self.direct or exc.errno != errno.EINVAL:
                raise
            self.direct = _refused(self.path, exc)
            self._fd = os.open(path, flags)
        self._buffer = mmap.mmap(-1, BUFFER_BYTES)
        self._view = memoryview(self._buffer)

    def read_into(self, offset: int, dest: memoryview, *, checksum: Any = None,
                  value: int = 0) -> int:
        """Fills `dest` (bytes) with the file's bytes from `offset`; returns `checksum(chunk,
        value)` continued over them (`value` when no checksum is given). EOFError when the
        file ends first."""
        done = 0
        while done < len(dest):
            start = offset + done
            base = start - start % BLOCK if self.direct else start
            want = min(BUFFER_BYTES, -(-(start + len(dest) - done - base) // BLOCK) * BLOCK)
            skip = start - base
            got = self._pread(want, base) - skip
            if got <= 0:
                raise EOFError(f"{self.path} ends before byte {start}")
            take = min(got, len(dest) - done)
            dest[done:done + take] = self._view[skip:skip + take]
            if checksum is not None:
                value = checksum(dest[done:done + take], value)
            done += take
        return value

    def read(self, offset: int, length: int) -> bytes:
        out = bytearray(length)
        self.read_into(offset, memoryview(out))
        return bytes(out)

    def close(self) -> None:
        if self._fd < 0:
            return
        try:
            if not self.direct and hasattr(os, "posix_fadvise"):
                os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(self._fd)
            self._fd = -1
            self._view.release()
            with contextlib.suppress(BufferError):
                self._buffer.close()

    def __enter__(self) -> DirectSource:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _pread(self, length: int, offset: int) -> int:
        chunk = self._view[:length]
        try:
            return os.preadv(self._fd, [chunk], offset)
        except OSError as exc:
            if not self.direct or exc.errno != errno.EINVAL:
                raise
            self.direct = _stop_direct(self._fd, self.path, exc)
            return os.preadv(self._fd, [chunk], offset)
        finally:
            chunk.release()


def _stop_direct(fd: int, path: str, exc: OSError) -> bool:
    """`fd` was opened with O_DIRECT, which its file system accepted at open and refuses at the
    first transfer: clears the flag (buffered from now on); False, as `_refused`."""
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
    return _refused(path, exc)


def _refused(path: str, exc: OSError) -> bool:
    """Logs, once per folder, that its file system refuses O_DIRECT; False (direct is off)."""
    folder = os.path.dirname(path)
    if folder not in _refused_folders:
        _refused_folders.add(folder)
        logger.info("%s refuses O_DIRECT (%s): checkpoint files there go through the page "
                    "cache", folder, exc)
    return False
