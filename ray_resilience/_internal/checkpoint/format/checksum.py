"""Data checksums: CRC-32C in hardware when the `crc32c` package is there, else zlib's CRC-32;
a file names the one it was written with, and readers verify with the same."""

from __future__ import annotations

import zlib
from typing import Any

try:
    import crc32c as _crc32c
except ImportError:  # pragma: no cover - a declared dependency; zlib keeps every reader working
    _crc32c = None

CHECKSUM = "crc32c" if _crc32c is not None else "crc32"
"""What new files carry."""


def known_checksum(name: Any) -> bool:
    return name == "crc32" or (name == "crc32c" and _crc32c is not None)


def checksum(name: str, data: Any, value: int = 0) -> int:
    """The running checksum `name` of `data` continued from `value` (both implementations
    release the GIL for large buffers)."""
    if name == "crc32c":
        return _crc32c.crc32c(data, value)
    return zlib.crc32(data, value)
