"""`CheckpointStorage`: the run's `checkpoints/` folder through `pyarrow.fs` (local, FSx or S3).
Picklable; every failure is a typed `CheckpointStorageError` naming the path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from ray_resilience._internal.checkpoint.format import layout
from ray_resilience._internal.checkpoint.format.direct.files import DirectFile
from ray_resilience.checkpoint.errors import CheckpointStorageError, classify
from ray_resilience.errors import ConfigError

logger = logging.getLogger(__name__)
T = TypeVar("T")


def resolve(storage_path: str,
            filesystem: pafs.FileSystem | None = None) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for a local path, a file:// or an s3:// URI."""
    if filesystem is not None:
        return filesystem, storage_path
    if "://" not in storage_path:
        return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(storage_path))
    try:
        return pafs.FileSystem.from_uri(storage_path)
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise ConfigError("RunConfig.storage_path", storage_path,
                          f"pyarrow cannot open it ({exc}); use a local path or "
                          "s3://bucket/prefix[?endpoint_override=host:port&scheme=http].") from exc


class CheckpointStorage:
    """Files under `<run_dir>/checkpoints/`; paths are relative to that folder, '/'-separated."""

    def __init__(self, fs: pafs.FileSystem, root: str, display_root: str) -> None:
        self.fs, self.root, self.display_root = fs, root.rstrip("/"), display_root.rstrip("/")
        self.is_local = isinstance(fs, pafs.LocalFileSystem)

    @classmethod
    def for_run(cls, storage_path: str, run_name: str,
                filesystem: pafs.FileSystem | None = None) -> CheckpointStorage:
        """Storage for `<storage_path>/<run_name>/checkpoints` (a path, file:// or s3:// URI).
        S3 credentials are not copied in: every process that unpickles it (coordinator, writers,
        ranks) resolves them from its own AWS credential chain (environment, profile, IRSA),
        unless `filesystem` was built with explicit keys."""
        fs, base = resolve(storage_path, filesystem)
        root = posixpath.join(base, run_name, layout.CHECKPOINTS_DIR)
        local = isinstance(fs, pafs.LocalFileSystem)
        display = root if local else f"{fs.type_name}://{root}"
        return cls(fs, root, display)

    def __reduce__(self):
        return (CheckpointStorage, (self.fs, self.root, self.display_root))


    def path(self, rel: str = "") -> str:
        return posixpath.join(self.root, rel) if rel else self.root

    def display(self, rel: str = "") -> str:
        """The path as a user would write it, for messages."""
        return posixpath.join(self.display_root, rel) if rel else self.display_root

    @contextlib.contextmanager
    def _errors(self, rel: str, operation: str) -> Iterator[None]:
        try:
            yield
        except (CheckpointStorageError, FileNotFoundError):
            raise
        except (OSError, ValueError, RuntimeError) as exc:
            raise classify(exc, self.display(rel), operation) from exc


    def list_step_dirs(self) -> list[layout.StepDir]:
        """Step folders present (committed or not), oldest first. Other names are ignored."""
        with self._errors("", "list"):
            infos = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        found = (layout.parse_step_dir(posixpath.basename(i.path.rstrip("/")))
                 for i in infos if i.type == pafs.FileType.Directory)
        return sorted(d for d in found if d is not None)

    def exists(self, rel: str) -> bool:
        with self._errors(rel, "stat"):
            return self.fs.get_file_info(self.path(rel)).type == pafs.FileType.File

    def read_bytes(self, rel: str) -> memoryview:
        """The whole file. Raises FileNotFoundError (not a storage error) when it is absent."""
        with self._errors(rel, "read"):
            try:
                with self.fs.open_input_file(self.path(rel)) as f:
                    return memoryview(f.read_buffer())
            except OSError as exc:
                if isinstance(exc, FileNotFoundError) or "NoSuchKey" in str(exc) \
                        or "Path does not exist" in str(exc):
                    raise FileNotFoundError(self.display(rel)) from exc
                raise


    def read_range(self, rel: str, offset: int, length: int) -> memoryview:
        """`length` bytes of a file from `offset` (one ranged read; the rest is never fetched)."""
        with self._errors(rel, "read"), self.fs.open_input_file(self.path(rel)) as f:
            return memoryview(f.read_at(length, offset))

    def make_dir(self, rel: str) -> None:
        if self.is_local:  # object stores have no folders to create
            with self._errors(rel, "create the folder"):
                self.fs.create_dir(self.path(rel), recursive=True)

    @contextlib.contextmanager
    def open_output(self, rel: str, *, direct: bool = False) -> Iterator[Any]:
        """A stream that replaces `rel` (fsync'ed on close locally, its pages then dropped from
        the page cache; on S3 visible once uploaded). `direct`: a local file is written with
        O_DIRECT where its file system takes it (`DirectFile`), never entering the page cache."""
        with self._errors(rel, "write"):
            if direct and self.is_local:
                with DirectFile(self.path(rel)) as stream:
                    yield stream
                return
            with self.fs.open_output_stream(self.path(rel)) as stream:
                yield stream
            if self.is_local:
                _fsync(self.path(rel), drop_cached=True)

    def write_atomic(self, rel: str, data: bytes) -> None:
        """Readers see the old content or the new, never a torn file."""
        if not self.is_local:
            with self.open_output(rel) as out:
                out.write(data)
            return
        tmp = f"{rel}.tmp-{uuid.uuid4().hex}"
        with self.open_output(tmp) as out:
            out.write(data)
        with self._errors(rel, "rename into"):
            self.fs.move(self.path(tmp), self.path(rel))
            _fsync(posixpath.dirname(self.path(rel)))

    def delete_file(self, rel: str) -> None:
        with self._errors(rel, "delete"), contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(self.path(rel))

    def delete_dir(self, rel: str) -> None:
        with self._errors(rel, "delete the folder"), contextlib.suppress(FileNotFoundError):
            self.fs.delete_dir(self.path(rel))

    def check_writable(self) -> None:
        """Creates the folder and writes/deletes a probe file; raises naming the path if not."""
        probe = f".write-probe-{uuid.uuid4().hex}"
        self.make_dir("")
        with self.open_output(probe) as out:
            out.write(b"ok")
        self.delete_file(probe)


def _fsync(path: str, *, drop_cached: bool = False) -> None:
    """Flushes `path` to its device; `drop_cached`: then drops its pages from the page cache.

    A checkpoint file is written once and read back only by a restore, which prefers the memory
    and local tiers; kept cached, each save's files take new memory (GBs per rank) from training,
    and the next save takes more instead of reusing what the last one freed. On the benchmark
    machine, a virtual machine whose host backs guest memory lazily, a 1 GB file written into
    memory not used lately cost ~7 CPU-seconds, one written into pages just dropped 0.3
    (docs/design.md, section 7)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        if drop_cached and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def retrying(fn: Callable[[], T], *, what: str, num_retries: int, backoff_s: float,
             max_backoff_s: float = 30.0,
             on_retry: Callable[[CheckpointStorageError, float], None] | None = None) -> T:
    """Calls `fn`, retrying transient storage errors with exponential backoff."""
    delay = backoff_s
    for attempt in range(num_retries + 1):
        try:
            return fn()
        except CheckpointStorageError as err:
            if not err.retryable or attempt == num_retries:
                raise
            logger.warning("%s failed (%s); retry %d/%d in %.1f s", what, err, attempt + 1,
                           num_retries, delay)
            if on_retry is not None:
                on_retry(err, delay)
            time.sleep(delay)
            delay = min(delay * 2, max_backoff_s)
    raise AssertionError("unreachable")  # pragma: no cover
