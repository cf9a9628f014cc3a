"""The run's full per-step record: every `report` of every rank, one JSON object per line in
`<run folder>/metrics.jsonl`, written through pyarrow.fs (a local/FSx file, or one S3 object
finished when the run ends). The supervisor only appends bytes the batches carry; the driver
reads the newest records back for `Result.metrics_history`.
"""

from __future__ import annotations

import collections
import json
import logging
import posixpath
import threading
from typing import Any

import pyarrow.fs as pafs

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
FLUSH_BYTES = 1 << 20
"""Buffered bytes that trigger a write before the next periodic flush."""


class MetricsLog:
    """Appends JSONL bytes to the run's metrics file; thread-safe. A storage error turns the
    log off with one warning (training never waits on it)."""

    def __init__(self, fs: pafs.FileSystem | None, run_path: str) -> None:
        self.path = posixpath.join(run_path, METRICS_FILE) if fs is not None else None
        self._fs, self._stream = fs, None
        self._buffer: list[bytes] = []
        self._buffered = 0
        self.bytes_written = 0
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def append(self, data: bytes) -> None:
        if not data or self.path is None:
            return
        with self._lock:
            self._buffer.append(data)
            self._buffered += len(data)
            due = self._buffered >= FLUSH_BYTES
        if due:
            self.flush()

    def flush(self) -> None:
        """Writes what is buffered (called periodically by the supervisor and at the end)."""
        with self._write_lock:
            with self._lock:
                chunks, self._buffer, self._buffered = self._buffer, [], 0
            if not chunks or self.path is None:
                return
            try:
                if self._stream is None:
                    self._fs.create_dir(posixpath.dirname(self.path), recursive=True)
                    self._stream = self._fs.open_output_stream(self.path)
                data = b"".join(chunks)
                self._stream.write(data)
                self.bytes_written += len(data)
            except Exception as exc:  # noqa: BLE001 - any storage error: the log stops, training not
                log.warning("metrics log %s failed, no further reports are logged: %s",
                            self.path, exc)
                self.path = None

    def close(self) -> None:
        self.flush()
        with self._write_lock:
            if self._stream is not None:
                try:
                    self._stream.close()
                except Exception as exc:  # noqa: BLE001 - the run's result matters more
                    log.warning("could not finish the metrics log %s: %s", self.path, exc)
                self._stream = None


def read_newest(fs: pafs.FileSystem, path: str, limit: int) -> list[dict[str, Any]]:
    """The newest `limit` records of a metrics log, sorted by (attempt, step, rank); [] if
    absent. Streams the file: memory stays bounded by `limit`."""
    newest: collections.deque[bytes] = collections.deque(maxlen=limit)
    try:
        with fs.open_input_stream(path) as f:
            tail = b""
            while chunk := f.read(1 << 20):
                lines = (tail + chunk).split(b"\n")
                tail = lines.pop()
                newest.extend(line for line in lines if line)
            if tail:
                newest.append(tail)
    except FileNotFoundError:
        return []
    records = [json.loads(line) for line in newest]
    return sorted(records, key=lambda m: (m["attempt"], m["step"], m["rank"]))
