"""Giving freed heap memory back to the OS between attempts (`malloc_trim`, glibc only):
glibc keeps what each attempt freed resident in its arenas (docs/design.md, section 5), unless
the process was told to keep it (a trim threshold set): then the next attempt's model and
optimizer reuse those pages, which costs less than touching new ones (section 8).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from collections.abc import Mapping
from typing import Any


@functools.cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


TRIM_THRESHOLD_TUNABLE = "glibc.malloc.trim_threshold"


def keeps_freed_memory(env: Mapping[str, str] = os.environ) -> str | None:
    """The glibc setting in `env` that tells the process to keep the memory it frees
    (`MALLOC_TRIM_THRESHOLD_`, or the trim threshold in `GLIBC_TUNABLES`), or None."""
    if "MALLOC_TRIM_THRESHOLD_" in env:
        return "MALLOC_TRIM_THRESHOLD_"
    for item in env.get("GLIBC_TUNABLES", "").split(":"):
        if item.partition("=")[0].strip() == TRIM_THRESHOLD_TUNABLE:
            return f"GLIBC_TUNABLES {TRIM_THRESHOLD_TUNABLE}"
    return None


def trim_heap() -> int:
    """Returns free heap pages to the OS (glibc); the resident bytes that released. Nothing
    when the process was told to keep freed memory (`keeps_freed_memory`): the user's setting
    wins."""
    libc = _libc()
    if libc is None or keeps_freed_memory() is not None:
        return 0
    before = resident_bytes()
    libc.malloc_trim(0)
    return max(0, before - resident_bytes())
