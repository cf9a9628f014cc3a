"""Giving freed heap memory back to the OS between attempts (`malloc_trim`, glibc only):
glibc keeps what each attempt freed resident in its arenas (docs/design.md, section 5).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
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


def trim_heap() -> int:
    """Returns free heap pages to the OS (glibc); the resident bytes that released."""
    libc = _libc()
    if libc is None:
        return 0
    before = resident_bytes()
    libc.malloc_trim(0)
    return max(0, before - resident_bytes())
