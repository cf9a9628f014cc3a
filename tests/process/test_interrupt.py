"""Interrupting a training thread: ``async_raise`` and its limits.

A thread hung in Python code is interrupted within milliseconds; a thread inside one native call
(``time.sleep``, a lock, a collective) only when that call returns, which is why the worker pairs
the interrupt with ``CollectiveAborter.abort()`` and the supervisor escalates native hangs to a
respawn. Run: ``pytest tests/process/test_interrupt.py``.
"""

from __future__ import annotations

import threading
import time

import pytest

from ray_resilience._internal.rank.interrupt import (
    TrainingInterrupted,
    async_raise,
    cancel_async_raise,
    capture_outcome,
)

DELIVERED_WITHIN_S = 10.0


def _start(target) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


@pytest.mark.timeout(30)
def test_async_raise_interrupts_a_python_sleep_loop_past_except_exception():
    started, box = threading.Event(), {}

    def hung_in_python() -> None:
        started.set()
        try:
            while True:
                try:
                    time.sleep(0.01)
                except Exception:  # noqa: BLE001 - user code swallowing errors must not
                    pass  # swallow the interrupt
        except TrainingInterrupted as exc:
            box["exc"] = exc

    thread = _start(hung_in_python)
    started.wait()
    assert async_raise(thread.ident, TrainingInterrupted)
    thread.join(DELIVERED_WITHIN_S)
    assert not thread.is_alive() and isinstance(box["exc"], TrainingInterrupted)


@pytest.mark.timeout(30)
def test_async_raise_cannot_interrupt_a_native_call_until_it_returns():
    """Why a native hang escalates to respawn: the exception waits for the C call to return."""
    native_s, started, box = 2.0, threading.Event(), {}

    def hung_in_native_code() -> None:
        started.set()
        start = time.monotonic()
        try:
            time.sleep(native_s)  # one C call (clock_nanosleep): no bytecode runs until it ends
            time.sleep(0)
        except TrainingInterrupted:
            box["delivered_after_s"] = time.monotonic() - start

    thread = _start(hung_in_native_code)
    started.wait()
    time.sleep(0.2)
    assert async_raise(thread.ident)
    thread.join(DELIVERED_WITHIN_S)
    assert box["delivered_after_s"] >= native_s * 0.9, box


@pytest.mark.timeout(30)
def test_async_raise_rejects_bad_arguments_and_can_be_cancelled():
    assert not async_raise(2**62)  # no such thread
    with pytest.raises(TypeError):
        async_raise(threading.get_ident(), ValueError("an instance, not a class"))  # type: ignore
    started, box = threading.Event(), {}

    def native_then_done() -> None:
        started.set()
        try:
            time.sleep(1.0)
            time.sleep(0)
            box["finished"] = True
        except TrainingInterrupted:
            box["interrupted"] = True

    thread = _start(native_then_done)
    started.wait()
    assert async_raise(thread.ident)
    assert cancel_async_raise(thread.ident)
    thread.join(DELIVERED_WITHIN_S)
    assert box == {"finished": True}


@pytest.mark.timeout(30)
def test_capture_outcome_records_results_errors_and_interrupts():
    assert capture_outcome(lambda: 7) == (7, None)
    _, exc = capture_outcome(lambda: 1 / 0)
    assert isinstance(exc, ZeroDivisionError)
    started, box = threading.Event(), {}

    def spin() -> None:
        started.set()
        while True:
            time.sleep(0.01)

    thread = _start(lambda: box.setdefault("outcome", capture_outcome(spin)))
    started.wait()
    assert async_raise(thread.ident)
    thread.join(DELIVERED_WITHIN_S)
    assert isinstance(box["outcome"][1], TrainingInterrupted)
