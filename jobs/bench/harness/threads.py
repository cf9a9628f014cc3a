"""This process's threads and what each has cost so far, read from /proc (Linux).

Python names its threads only for Python (`threading`); the kernel's name (`comm`) of a thread
Python started is the process's. So the name is Python's where the thread is a Python thread,
else the kernel's (gloo's, Ray's C++ threads, torch's pools).
"""

from __future__ import annotations

import os
import threading
from typing import Any

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(tid: str) -> tuple[str, float, int, int, int] | None:
    """(comm, CPU seconds, nice, voluntary, involuntary context switches) of one thread."""
    base = f"/proc/self/task/{tid}"
    try:
        with open(f"{base}/stat", encoding="utf-8") as f:
            raw = f.read()
        with open(f"{base}/status", encoding="utf-8") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return None  # exited meanwhile
    comm = raw[raw.index("(") + 1:raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2:].split()
    cpu_s = (int(fields[11]) + int(fields[12])) / TICKS
    return (comm, cpu_s, int(fields[16]), int(status["voluntary_ctxt_switches"]),
            int(status["nonvoluntary_ctxt_switches"]))


def snapshot() -> list[dict[str, Any]]:
    """Every thread of this process: tid, name, CPU seconds, nice, context switches."""
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    out = []
    for tid in sorted(os.listdir("/proc/self/task"), key=int):
        found = _stat(tid)
        if found is None:
            continue
        comm, cpu_s, nice, voluntary, involuntary = found
        out.append({"tid": int(tid), "name": names.get(int(tid), comm), "python": int(tid) in names,
                    "cpu_s": cpu_s, "nice": nice, "voluntary": voluntary,
                    "involuntary": involuntary})
    return out
