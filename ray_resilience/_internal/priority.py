"""Scheduling of threads that do background work beside training threads (Linux).

Ray runs every worker process at the same priority (`RAY_worker_niceness`, 15, on the main
thread and the Python threads it starts; Ray's C++ threads, started before, keep nice 0), the
ranks' included, so a background actor that shares their node competes with training threads as
an equal. Two levels below: `"low"` (nice 19) and `"background"` (`SCHED_IDLE`: a waking
training thread preempts it at once, and against a busy nice-15 thread it gets 3/39 of a core,
not nothing). Neither can be undone without CAP_SYS_NICE, so only for threads whose work may
wait. `defer_wakeups` gives up no priority: it only stops a thread's wake-ups from preempting.
"""

from __future__ import annotations

import os
import threading

PRIORITIES: tuple[str, ...] = ("background", "low", "inherit")


def lower_thread(how: str, tid: int = 0) -> str:
    """Lowers thread `tid` (0: the calling thread) to `how`; returns what it got: "idle",
    "nice" or "normal" (neither was allowed, or `how` is "inherit")."""
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
    """Puts the calling thread under `SCHED_BATCH` (Linux): it keeps its nice value, so its share
    of the CPU, but its wake-ups never preempt the thread running on that core (the scheduler
    skips wake-up preemption for batch threads); it runs when that thread blocks or its time
    slice ends. For the threads a training thread hands work to at each save: woken from inside
    `save`, each preempted the training thread there (a switch out and back, ~10-70 us of a
    0.5 ms save) only to wait for the GIL the training thread held. Unlike "background", no
    priority is given up, so a batch thread holding the GIL is never starved. Returns whether
    it applied."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        return True
    except (AttributeError, OSError):
        return False


def lower_process(how: str, *, keep: tuple[int | None, ...] = ()) -> str:
    """Lowers every thread of this process but those whose native ids are in `keep` (threads
    started later inherit the level of the thread that starts them); returns what the calling
    thread got."""
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
