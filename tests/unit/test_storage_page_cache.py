"""A checkpoint file written to a local filesystem leaves the page cache once it is on its device
(`CheckpointStorage.open_output`): saves reuse the memory the last one's files freed instead of
taking more from training. Residency is read with mincore(2)."""

from __future__ import annotations

import ctypes
import mmap
import os

import pytest

from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage

pytestmark = pytest.mark.timeout(60)
NBYTES = 8 << 20
_libc = ctypes.CDLL(None, use_errno=True)


def _resident_fraction(path: str) -> float:
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


def test_a_written_checkpoint_file_leaves_the_page_cache(tmp_path):
    data = os.urandom(NBYTES)
    kept = tmp_path / "plain.bin"
    with open(kept, "wb") as f:  # the control: a plain write stays cached
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    if _resident_fraction(str(kept)) < 0.9:
        pytest.skip(f"{tmp_path}'s filesystem does not keep written pages cached")
    storage = CheckpointStorage.for_run(str(tmp_path), "run")
    storage.make_dir("step")
    with storage.open_output("step/__0_0.distcp") as out:
        out.write(data)
    path = storage.path("step/__0_0.distcp")
    assert _resident_fraction(path) < 0.1
    with open(path, "rb") as f:  # and the bytes are all there
        assert f.read() == data
