"""Whether a rank's training thread moves, sampled from its side thread at each heartbeat.

Liveness is separate from reporting: a loop that reports every N steps (or once per epoch) is
alive while its training thread runs. Two cheap signals, read without instrumenting the thread
(no `sys.setprofile`): the thread's Python stack (code and line of each frame, from
`sys._current_frames()`) and the CPU time the thread used (its POSIX thread CPU clock). A changed
stack, or more than `MIN_CPU_S` of CPU since the previous sample, counts as movement. A thread
blocked in one call (a hung collective, a deadlock, a sleep that never ends, a Python wait loop
on one line) changes neither; a thread training steps changes both. CPU time alone, with the
stack unchanged, counts only for `busy_cap_s` (the step timeout in force when the attempt
started): a thread spinning at one stack for longer (a livelock, or a CUDA spin-wait on a hung
NCCL kernel at one `.item()`) stops counting as moving, so its silence is found at most one cap
after its own timeout would have found it. (The process group's collective sequence number would
be a third signal, but reading it blocks while a gloo collective is in flight.)
"""

from __future__ import annotations

import sys
import time
from typing import Any

MAX_FRAMES = 64
"""Innermost frames fingerprinted (deep enough for any training loop, cheap to walk)."""
MIN_CPU_S = 0.005
"""CPU used between two samples that counts as work: a Python wait loop (sleep, check a flag)
uses well under a millisecond per heartbeat interval; a training step uses far more."""


class ActivityProbe:
    """Counts the samples in which the watched thread had moved since the previous one."""

    def __init__(self, busy_cap_s: float | None = None) -> None:
        """`busy_cap_s`: how long CPU use at an unchanged stack counts as movement (None: no
        limit)."""
        self._thread_id: int | None = None
        self._clock: int | None = None
        self._last: Any = None
        self._last_at = 0.0
        self._cpu = 0.0
        self._cap = busy_cap_s
        self.count = 0

    def watch(self, thread_id: int | None) -> None:
        """Starts (or stops, with None) watching a thread."""
        self._thread_id, self._last, self._clock = thread_id, None, None
        if thread_id is not None:
            try:
                self._clock = time.pthread_getcpuclockid(thread_id)
                self._cpu = time.clock_gettime(self._clock)
            except (AttributeError, OSError):  # no per-thread CPU clock here: the stack alone
                self._clock = None

    def sample(self) -> int | None:
        """The counter after this sample; None while no thread is watched."""
        thread_id = self._thread_id
        if thread_id is None:
            return None
        stack = _stack(sys._current_frames().get(thread_id))
        now = time.monotonic()
        worked = self._worked()  # read at every sample: CPU counts from the previous one
        if stack != self._last:
            self._last, self._last_at = stack, now
            self.count += 1
        elif worked and (self._cap is None or now - self._last_at < self._cap):
            self.count += 1
        return self.count

    def _worked(self) -> bool:
        if self._clock is None:
            return False
        try:
            cpu = time.clock_gettime(self._clock)
        except OSError:  # the thread ended
            return False
        worked, self._cpu = cpu - self._cpu >= MIN_CPU_S, cpu
        return worked


def _stack(frame: Any) -> tuple[tuple[int, int], ...]:
    found = []
    while frame is not None and len(found) < MAX_FRAMES:
        found.append((id(frame.f_code), frame.f_lineno))
        frame = frame.f_back
    return tuple(found)
