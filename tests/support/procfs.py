"""What Linux's /proc says about another process's threads (tests look from outside)."""

from __future__ import annotations

import os

SCHED_OTHER, SCHED_BATCH, SCHED_IDLE = 0, 3, 5


def thread_policies(pid: int) -> dict[int, int]:
    """tid -> scheduling policy (field 41 of /proc/<pid>/task/<tid>/stat) of every thread of
    `pid`; empty when the process is gone."""
    return _stat_field(pid, 41)


def thread_nices(pid: int) -> dict[int, int]:
    """tid -> nice value (field 19 of /proc/<pid>/task/<tid>/stat) of every thread of `pid`."""
    return _stat_field(pid, 19)


def _stat_field(pid: int, field: int) -> dict[int, int]:
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    found = {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        found[int(tid)] = int(fields[field - 3])  # fields[0] is field 3, the state
    return found
