"""CPU priority of background threads beside training threads (Linux): "low" (nice 19),
"background" (SCHED_IDLE), and `defer_wakeups` (SCHED_BATCH: no priority given up, but its
wake-ups never preempt). Why: docs/design.md, section 7.
"""

from __future__ import annotations

import os
import threading

PRIORITIES: tuple[str, ...] = ("background", "low", "inherit")


def lower_thread(how: str, tid: int = 0) -> str:
    """Lowers thread `tid` (0: this one) to `how`; returns "idle", "nice" or "normal"."""
    if how == "background":
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))  # one thread (Linux)
            return "idle"
        except (AttributeError, OSError):
            pass  # not Linux, or a seccomp profile forbids it: nice 19 still helps
    if how in ("background", "low"):
        try:
            os.setpriority(os.PRIO_PROCESS, tid or threading.get_native_id(), 19)
            return "nice"
        except (AttributeError, OSError):
            pass
    return "normal"


def defer_wakeups() -> bool:
    """Puts the calling thread under `SCHED_BATCH`: same CPU share, but its wake-ups never
    preempt the running thread. For threads a save wakes, which otherwise preempted the training
    thread only to wait for its GIL. Returns whether it applied."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        return True
    except (AttributeError, OSError):
        return False


def lower_process(how: str, *, keep: tuple[int | None, ...] = ()) -> str:
    """Lowers every thread of this process but those in `keep` (later threads inherit);
    returns what the calling thread got."""
    if how == "inherit":
        return "normal"
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = []
    me = threading.get_native_id()
    for tid in tids:
        if tid != me and tid not in keep:
            lower_thread(how, tid)
    return lower_thread(how)
