"""Where and with what a benchmark ran: written into every result file."""

from __future__ import annotations

import contextlib
import os
import platform
import resource
import time
import uuid
from importlib import metadata
from typing import Any

PACKAGES = ("torch", "ray", "torchft", "nvidia-resiliency-ext")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def describe(command: str) -> dict[str, Any]:
    """The command, the UTC date, the machine and the package versions."""
    return {
        "command": command, "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"cpu": _cpu_model(), "cores": os.cpu_count(),
                    "memory_gib": round(_memory_gib(), 1), "python": platform.python_version(),
                    "load_average_at_start": round(os.getloadavg()[0], 2)},
        "versions": {p: _version(p) for p in PACKAGES},
    }


WRITE_PROBE_BYTES = 256 * 2**20
"""What `write_cost` writes: long enough to see a file system's per-byte cost, short enough
(seconds on a slow disk) to run at the start and end of every size of a benchmark."""


def write_cost(folder: str, nbytes: int = WRITE_PROBE_BYTES, *,
               direct: bool = False) -> dict[str, Any]:
    """What writing a new file of `nbytes` into `folder` (then fsync) costs this process, per
    GB: CPU seconds (user + system) and wall seconds. A checkpoint writes new files, and every
    mechanism that saves pays what they cost; on this benchmark machine's virtual disk that
    swings between a fraction of a CPU-second and ~10 per GB. `direct`: through ours' O_DIRECT
    writer (`DirectFile`, what ours' writers use), past the page cache."""
    from ray_resilience._internal.checkpoint.format.direct.files import (  # noqa: PLC0415
        DirectFile,
    )

    data = memoryview(bytearray(b"\x5a" * nbytes))
    path = os.path.join(folder, f".write-probe-{uuid.uuid4().hex}")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu0, wall0 = usage.ru_utime + usage.ru_stime, time.perf_counter()
    went_direct = None
    try:
        if direct:
            with DirectFile(path) as out:
                out.write(data)
            went_direct = out.direct
        else:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                done = 0
                while done < nbytes:
                    done += os.write(fd, data[done:])
                os.fsync(fd)
            finally:
                os.close(fd)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    per_gb = 1e9 / nbytes
    return {"folder": folder, "bytes": nbytes,
            "cpu_s_per_gb": round((usage.ru_utime + usage.ru_stime - cpu0) * per_gb, 3),
            "wall_s_per_gb": round((time.perf_counter() - wall0) * per_gb, 3),
            **({"direct": went_direct} if direct else {})}


def touch_cost(nbytes: int = WRITE_PROBE_BYTES) -> dict[str, Any]:
    """What first touching `nbytes` of new anonymous memory costs this process, per GB (CPU
    seconds), and touching it again. On a virtual machine whose host backs guest memory lazily
    the first touch of memory the guest has not used lately costs far more than the second (this
    benchmark machine: ~10 CPU-s per GB against ~0.1); a mechanism that allocates fresh buffers
    per save pays it, one that reuses its buffers pays it once."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = usage.ru_utime + usage.ru_stime
    block = bytearray(nbytes)  # zero-filled: this is the first touch of every page
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu1 = usage.ru_utime + usage.ru_stime
    memoryview(block)[::4096] = b"\x02" * len(range(0, nbytes, 4096))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    per_gb = 1e9 / nbytes
    del block
    return {"bytes": nbytes, "first_cpu_s_per_gb": round((cpu1 - cpu0) * per_gb, 3),
            "again_cpu_s_per_gb": round((usage.ru_utime + usage.ru_stime - cpu1) * per_gb, 3)}
