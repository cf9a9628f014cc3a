"""`trim_heap`: memory an attempt freed goes back to the OS (glibc keeps it resident otherwise),
unless the process was told to keep it for the next attempt."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ray_resilience._internal.process_groups.heap import keeps_freed_memory

pytestmark = pytest.mark.timeout(60)

PROBE = """
from ray_resilience._internal.process_groups.heap import resident_bytes, trim_heap
blocks = [bytearray(4000) for _ in range(50_000)]  # ~200 MB through malloc
keep = blocks[::50]  # live chunks between the freed ones: glibc cannot give the gaps back alone
del blocks
before = resident_bytes()
released = trim_heap()
print(before, released, resident_bytes(), len(keep))
"""

KEEP = 1 << 40


def _probe(**env: str) -> tuple[int, int, int]:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True, env={**clean, **env})
    before, released, after, _ = map(int, out.stdout.split())
    return before, released, after


def test_fragmented_free_memory_is_returned_to_the_os():
    before, released, after = _probe()
    assert released > 100e6, (before, released, after)
    assert after < before - 100e6


@pytest.mark.parametrize("env", [{"MALLOC_TRIM_THRESHOLD_": str(KEEP)},
                                 {"GLIBC_TUNABLES": f"glibc.malloc.trim_threshold={KEEP}"}])
def test_a_process_told_to_keep_freed_memory_keeps_it(env):
    before, released, after = _probe(**env)
    assert released == 0
    assert after > before - 20e6, (before, after)  # the ~200 MB freed stay for reuse


def test_keep_settings_are_recognized_in_either_form():
    assert keeps_freed_memory({}) is None
    assert keeps_freed_memory({"MALLOC_ARENA_MAX": "1"}) is None
    assert keeps_freed_memory({"MALLOC_TRIM_THRESHOLD_": "0"}) == "MALLOC_TRIM_THRESHOLD_"
    tunables = "glibc.malloc.arena_max=1:glibc.malloc.trim_threshold=99"
    assert keeps_freed_memory({"GLIBC_TUNABLES": tunables}) == \
        "GLIBC_TUNABLES glibc.malloc.trim_threshold"
    assert keeps_freed_memory({"GLIBC_TUNABLES": "glibc.malloc.arena_max=1"}) is None
