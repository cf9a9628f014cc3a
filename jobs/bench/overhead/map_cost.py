"""What mapping shared memory costs this machine, per GB (CPU seconds of this process): a copy
into a new memfd (first touch), the same copy again through the same mapping, through a second
mapping of the same memfd (its pages exist; the copy faults them in one by one), and through a
second mapping made with MAP_POPULATE (the kernel fills the page tables first; its cost counted
with the copy's). The saves' hand-offs map memory another process wrote (docs/design.md,
section 7); this is what the mapping flags there are chosen by.

    python jobs/bench/overhead/map_cost.py [--gb 1]     # prints one JSON line
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import resource

import numpy as np


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _copy_cost(source: np.ndarray, mapping: mmap.mmap) -> float:
    start = _cpu()
    np.frombuffer(mapping, dtype=np.uint8)[:] = source
    return _cpu() - start


def map_cost(nbytes: int) -> dict[str, float]:
    source = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    fd = os.memfd_create("rr-map-cost", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, nbytes)
        first = mmap.mmap(fd, nbytes)
        costs = {"new_memory": _copy_cost(source, first),
                 "same_mapping": _copy_cost(source, first),
                 "second_mapping": _copy_cost(source, mmap.mmap(fd, nbytes))}
        start = _cpu()
        populated = mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
        costs["second_mapping_populated"] = _cpu() - start + _copy_cost(source, populated)
    finally:
        os.close(fd)
    per_gb = 1e9 / nbytes
    return {name: round(seconds * per_gb, 3) for name, seconds in costs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="buffer size (GB)")
    args = parser.parse_args()
    print(json.dumps({"bytes": int(args.gb * 1e9), "cpu_s_per_gb": map_cost(int(args.gb * 1e9))}))


if __name__ == "__main__":
    main()
