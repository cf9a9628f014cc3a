"""A local filesystem whose file writes wait while a gate file exists, so a test can hold a
checkpoint writer's shard write part-way (after it started, before anything is written)."""

from __future__ import annotations

import os
import pathlib
import time
from typing import Any

import pyarrow.fs as pafs
from fsspec.implementations.local import LocalFileSystem


class GatedHandler(pafs.FSSpecHandler):
    """fsspec's local filesystem; `open_output_stream` touches `<gate>.waiting` and waits while
    `gate` exists (at most `timeout_s`)."""

    def __init__(self, gate: str, timeout_s: float = 120.0) -> None:
        super().__init__(LocalFileSystem(auto_mkdir=True))  # as pyarrow's own local fs
        self.gate, self.timeout_s = gate, timeout_s

    def __reduce__(self) -> tuple[Any, ...]:  # shipped to the writer actors
        return (GatedHandler, (self.gate, self.timeout_s))

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        if os.path.exists(self.gate):
            pathlib.Path(f"{self.gate}.waiting").touch()
            deadline = time.monotonic() + self.timeout_s
            while os.path.exists(self.gate) and time.monotonic() < deadline:
                time.sleep(0.02)
        return super().open_output_stream(path, metadata)


def gated_filesystem(gate: str) -> pafs.FileSystem:
    return pafs.PyFileSystem(GatedHandler(gate))
