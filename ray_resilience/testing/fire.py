"""Firing a planned fault inside a worker process, on the training thread.

`fire` is called by the worker's per-step hook at the moment a fault from the run's FaultPlan is
due, after the caller has recorded the fault's wall time with the supervisor (a SIGKILL loses
anything not sent yet). Each kind imitates a real failure as closely as one process can:

- exception:   raise `InjectedFault` (what a bug in user code looks like).
- hang:        a Python-level sleep loop. Ticks of HANG_TICK_S return to the interpreter between
               sleeps, so an async exception (`PyThreadState_SetAsyncExc`, which is how an
               in-process restart interrupts the training thread) ends it.
- native_hang: one very long C-level sleep. The interpreter never regains control, so an async
               exception is not delivered; like a rank stuck inside a collective or a CUDA call,
               only killing the process (or a signal handler) ends it. The sleep releases the
               GIL, so the actor still answers control calls and heartbeats keep flowing, as
               with a real stuck collective. This is the case that forces the supervisor up
               the recovery ladder from in-process restart to respawn.
- sigkill:     `kill -9` of the own process: no Python cleanup, no last message.
- oom:         the way the kernel OOM killer ends a process: SIGKILL. Memory is deliberately not
               exhausted (that would hurt the other processes on a shared machine), so the exit
               looks exactly like `sigkill`; the supervisor records cause "oom" from the plan
               (`FaultKind.recorded_cause`).

The other kinds (node_loss, writer_kill, storage_outage, corrupt_checkpoint) act on things the
training thread does not own; the supervisor or the test harness fires them, and `fire` refuses
them with `HarnessFaultError`.

`stop_process` is a stronger variant of native_hang kept for harness use: SIGSTOP freezes every
thread of the process, including the actor's control thread and the progress reporter, which is
what a wedged machine looks like from outside.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import NoReturn

from ray_resilience.testing.faults import Fault, FaultKind, InjectedFault

#: Sleep per tick of a Python-level hang; bounds how long an async exception waits to land.
HANG_TICK_S = 0.05
#: Length of the single C-level sleep of a native hang (about 11.6 days; re-entered if it ends).
NATIVE_HANG_S = 1_000_000.0


class HarnessFaultError(NotImplementedError):
    """`fire` was asked for a kind that the supervisor or the test harness must fire."""

    def __init__(self, fault: Fault) -> None:
        super().__init__(
            f"fault {fault.id}: kind {fault.kind.value!r} is fired by the supervisor or the test "
            "harness, not from the training thread; workers must only fire faults whose "
            "FaultKind.fired_in_worker is True."
        )
        self.fault = fault


def fire(fault: Fault) -> NoReturn:
    """Fire `fault` in this process. Never returns: it raises, blocks forever, or kills.

    Called on the training thread when the fault is due. The caller must have reported the
    fault (id and time) to the supervisor already, because sigkill and oom end the process here.
    """
    if not fault.kind.fired_in_worker:
        raise HarnessFaultError(fault)
    _announce(fault)
    if fault.kind is FaultKind.EXCEPTION:
        raise InjectedFault(fault)
    if fault.kind is FaultKind.HANG:
        _python_hang()
    if fault.kind is FaultKind.NATIVE_HANG:
        _native_hang()
    # sigkill and oom: the OOM killer also sends SIGKILL, so both end the process the same way.
    _kill_self()


def stop_process() -> None:
    """Freeze the whole process with SIGSTOP (every thread stops; SIGCONT or SIGKILL ends it)."""
    os.kill(os.getpid(), signal.SIGSTOP)


def _announce(fault: Fault) -> None:
    # The only trace a killed process leaves in its log; flushed because SIGKILL skips buffers.
    print(f"ray_resilience: firing injected fault {fault.id}", file=sys.stderr, flush=True)


def _python_hang() -> NoReturn:
    while True:
        time.sleep(HANG_TICK_S)


def _native_hang() -> NoReturn:
    while True:
        time.sleep(NATIVE_HANG_S)


def _kill_self() -> NoReturn:
    os.kill(os.getpid(), signal.SIGKILL)
    while True:  # SIGKILL is delivered asynchronously; never return into the training loop.
        time.sleep(HANG_TICK_S)
