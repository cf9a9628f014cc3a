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


def descendants_named(marker: str, root: int | None = None) -> list[int]:
    """Pids of the processes under `root` (default: this one; a local Ray started by this
    process runs under it) whose command line contains `marker` (e.g. "ray::CheckpointWriter")."""
    parent: dict[int, int] = {}
    cmdline: dict[int, str] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                parent[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline[int(name)] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
    top = os.getpid() if root is None else root

    def under(pid: int) -> bool:
        while pid > 1:
            if pid == top:
                return True
            pid = parent.get(pid, 0)
        return False

    return [pid for pid, cmd in cmdline.items() if marker in cmd and pid != top and under(pid)]
