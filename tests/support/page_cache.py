"""How much of a file is in the page cache (mincore(2) over a private mapping)."""

from __future__ import annotations

import ctypes
import mmap
import os

_libc = ctypes.CDLL(None, use_errno=True)


def resident_fraction(path: str) -> float:
    """The fraction of `path`'s pages in the page cache."""
    page = os.sysconf("SC_PAGE_SIZE")
    with open(path, "rb") as f:
        # A private mapping: mincore reports the file's own pages until one is written.
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    try:
        pages = -(-len(mapping) // page)
        vector = (ctypes.c_ubyte * pages)()
        address = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
        if _libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(len(mapping)), vector):
            raise OSError(ctypes.get_errno(), "mincore")
        return sum(v & 1 for v in vector) / pages
    finally:
        del address
        mapping.close()
