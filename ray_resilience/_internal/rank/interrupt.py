"""Interrupting a training thread stuck in Python code (``PyThreadState_SetAsyncExc``).

Delivered at the thread's next bytecode: not while it is blocked in one native call (a sleep, a
lock, a collective). Pair it with ``CollectiveAborter.abort()`` for collectives.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from typing import TypeVar

logger = logging.getLogger(__name__)
T = TypeVar("T")


class TrainingInterrupted(BaseException):
    """Raised in the training thread when the worker stops the attempt: a ``BaseException``,
    so ``except Exception:`` in user code cannot swallow it. Takes no required arguments."""

    def __init__(self, reason: str = "the attempt was interrupted by the worker") -> None:
        super().__init__(reason)
        self.reason = reason


# Two prototypes: clearing needs a real NULL, not Py_None. PYFUNCTYPE keeps the GIL held.
_SET_ASYNC_EXC = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi))
_CLEAR_ASYNC_EXC = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi))


def async_raise(thread_ident: int, exc_type: type[BaseException] = TrainingInterrupted) -> bool:
    """Schedules ``exc_type()`` in thread ``thread_ident``; False when no such live thread."""
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
    """Clears an undelivered ``async_raise`` (the thread finished on its own); True if it exists."""
    return _CLEAR_ASYNC_EXC(ctypes.c_ulong(thread_ident), None) == 1



def capture_outcome(fn: Callable[[], T]) -> tuple[T | None, BaseException | None]:
    """Runs ``fn``; ``(result, None)`` or ``(None, exception)``, never raises, also when the
    interrupt lands while the handler records a collective's error."""
    try:
        try:
            return fn(), None
        except BaseException as exc:  # noqa: BLE001 - the outcome is data for the worker
            return None, exc
    except TrainingInterrupted as late:
        return None, late
