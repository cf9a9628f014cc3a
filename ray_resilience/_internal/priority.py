"""CPU priority of the run's processes and of background threads beside training threads
(Linux). Ranks and writers start at nice 0, as training runs outside Ray (Ray starts its workers
at nice 15 unless `RAY_worker_niceness` says otherwise). Background threads: "background"
(SCHED_BATCH, about a twelfth of a core against a busy training thread), "low" (nice 19), "idle"
(SCHED_IDLE: only CPU nothing else wants) and `defer_wakeups` (SCHED_BATCH: no priority given
up, but its wake-ups never preempt). Why: docs/design.md, sections 2 and 7.
"""

from __future__ import annotations

import os
import threading

PRIORITIES: tuple[str, ...] = ("background", "low", "inherit")


RAY_WORKER_NICENESS_ENV_VAR = "RAY_worker_niceness"
"""Ray's setting of the nice value it starts a worker process at (15 when unset); Ray reads it
from an actor's `runtime_env` env vars, so a process started with it at 0 needs no privilege."""
RANK_NICENESS = "0"
"""Where the job does not set `RAY_worker_niceness`: ranks and writers start at nice 0, as
under torchrun. At Ray's 15 every wake-up of Ray's own daemons (nice 0) preempts a rank in the
middle of a step its peers wait for (docs/design.md, section 2)."""
BACKGROUND_STEPS = 11
"""How many nice levels "background" puts a thread below its process: CFS weight 1024 against
87 at nice 0 and 11, about a twelfth of a core against a busy training thread."""


def rank_niceness() -> dict[str, str]:
    """The env var that starts a run's ranks and writers at their nice value: the job's own
    `RAY_worker_niceness` (its runtime env, which the supervisor inherits) where it sets one,
    else 0."""
    return {RAY_WORKER_NICENESS_ENV_VAR: os.environ.get(RAY_WORKER_NICENESS_ENV_VAR,
                                                        RANK_NICENESS)}


def lower_thread(how: str, tid: int = 0, *, base: int | None = None) -> str:
    """Lowers thread `tid` (0: this one) to `how`; returns "idle", "nice" or "normal".
    "background" is `BACKGROUND_STEPS` nice levels below `base` (default: the thread's own nice
    value), or SCHED_IDLE where that passes 19 (against Ray's nice-15 workers, where SCHED_IDLE's
    weight of 3 is about the same share; against nice 0 it would starve)."""
    native = tid or threading.get_native_id()
    if how == "background":
        try:
            if base is None:
                base = os.getpriority(os.PRIO_PROCESS, native)
            target = base + BACKGROUND_STEPS
            if target <= 19:
                # SCHED_BATCH too: like SCHED_IDLE, a writer waking after a long sleep never
                # preempts a running rank (the scheduler would otherwise let it in at once).
                os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
                os.setpriority(os.PRIO_PROCESS, native, target)
                return "nice"
        except (AttributeError, OSError):
            return "normal"
        how = "idle"
    if how == "idle":
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))  # one thread (Linux)
            return "idle"
        except (AttributeError, OSError):
            pass  # not Linux, or a seccomp profile forbids it: nice 19 still helps
    if how in ("idle", "low"):
        try:
            os.setpriority(os.PRIO_PROCESS, native, 19)
            return "nice"
        except (AttributeError, OSError):
            pass
    return "normal"


def restore_thread(tid: int) -> bool:
    """Puts thread `tid` back at the calling thread's priority (SCHED_OTHER, its nice value):
    for a background thread whose work became what the caller waits for. Leaving SCHED_IDLE or
    raising a nice value needs CAP_SYS_NICE or RLIMIT_NICE; without them, or when the thread
    is gone, returns False and changes nothing."""
    try:
        base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, tid, base)
        return True
    except (AttributeError, OSError):
        return False


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
    try:  # the process's own value: Ray's threads started before its nice call may differ
        base = os.getpriority(os.PRIO_PROCESS, me)
    except (AttributeError, OSError):
        base = None
    for tid in tids:
        if tid != me and tid not in keep:
            lower_thread(how, tid, base=base)
    return lower_thread(how, base=base)
