"""Where and with what a benchmark ran: written into every result file."""

from __future__ import annotations

import os
import platform
import time
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
