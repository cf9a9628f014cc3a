"""Interrupting a training thread that is stuck in Python code.

``async_raise`` schedules an exception in another thread with ``PyThreadState_SetAsyncExc``. The
interpreter delivers it the next time that thread executes Python bytecode, which covers hangs in
Python (a ``while not ready: time.sleep(0.1)`` loop, a slow data loader written in Python). It
does NOT cover a thread blocked inside one native call: ``time.sleep(600)``, an un-timed
``threading.Lock.acquire()`` (a deadlock waits in ``sem_wait``), or a gloo/NCCL collective. The
exception stays pending until that call returns. For collectives, pair it with
``CollectiveAborter.abort()`` (the call then fails and the pending exception fires right after);
anything else blocked natively is the case the supervisor escalates to a respawn after the hard
timeout.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from typing import TypeVar

logger = logging.getLogger(__name__)
T = TypeVar("T")


class TrainingInterrupted(BaseException):
    """Raised inside the training thread when the worker stops the current attempt.

    A ``BaseException`` (like ``KeyboardInterrupt``), not an ``Exception``: training code and
    libraries are full of ``except Exception:`` blocks (retry loops, "log and continue" around a
    data batch) that would swallow the interrupt and keep the hung attempt running. ``finally``
    blocks and context managers still run, so locks, files and ``with mesh:`` scopes unwind
    cleanly. Not a subclass of ``KeyboardInterrupt``/``SystemExit``: those mean "the user
    cancelled" / "the process exits" to Ray and to other libraries, and this means neither. The
    worker's wrapper must catch it explicitly. ``PyThreadState_SetAsyncExc`` instantiates the class
    without arguments, so the constructor takes none that are required.
    """

    def __init__(self, reason: str = "the attempt was interrupted by the worker") -> None:
        super().__init__(reason)
        self.reason = reason


# The thread id is `unsigned long` in CPython >= 3.7. Two prototypes of the same C function:
# passing None through a `py_object` argument would send Py_None, but clearing a pending
# exception needs a real NULL pointer. PYFUNCTYPE keeps the GIL held, as the C API requires.
_SET_ASYNC_EXC = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi))
_CLEAR_ASYNC_EXC = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi))


def async_raise(thread_ident: int, exc_type: type[BaseException] = TrainingInterrupted) -> bool:
    """Schedules ``exc_type()`` in the thread ``thread_ident``; True if it was scheduled.

    Returns False when no live Python thread has that id (it already finished). Delivery is
    asynchronous: see the module docstring for when it arrives and when it cannot. Calling it on
    the current thread raises at the caller's next bytecode, which is legal but rarely useful.
    """
    if not (isinstance(exc_type, type) and issubclass(exc_type, BaseException)):
        raise TypeError(f"exc_type must be an exception class, got {exc_type!r}")
    modified = _SET_ASYNC_EXC(ctypes.c_ulong(thread_ident), exc_type)
    if modified > 1:  # documented as impossible for a unique id; undo rather than hit strangers
        _CLEAR_ASYNC_EXC(ctypes.c_ulong(thread_ident), None)
        logger.error("PyThreadState_SetAsyncExc matched %d threads for id %d; undone",
                     modified, thread_ident)
        return False
    return modified == 1


def cancel_async_raise(thread_ident: int) -> bool:
    """Clears an exception scheduled by ``async_raise`` that has not been delivered yet.

    For a worker that interrupted a thread which then finished on its own: the wrapper should not
    receive a stale interrupt in its clean-up code. True if the thread exists.
    """
    return _CLEAR_ASYNC_EXC(ctypes.c_ulong(thread_ident), None) == 1



def capture_outcome(fn: Callable[[], T]) -> tuple[T | None, BaseException | None]:
    """Runs ``fn`` here; returns ``(result, None)`` or ``(None, exception)``, never raises.

    The body for a training thread that may be interrupted. An interrupt scheduled while ``fn``
    sat in native code (a collective) is delivered at the first bytecode after that call fails,
    which may be inside the handler that is recording the collective's error; the outer handler
    catches that late arrival, so the thread never dies with an unrecorded exception. One
    delivered after this function returned lands in the caller's code: keep the thread's body
    after it minimal, or call ``cancel_async_raise`` once the outcome is in.
    """
    try:
        try:
            return fn(), None
        except BaseException as exc:  # noqa: BLE001 - the outcome is data for the worker
            return None, exc
    except TrainingInterrupted as late:
        return None, late
