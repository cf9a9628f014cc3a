"""Whether a rank's training thread moves, sampled from its side thread at each heartbeat.

Liveness is separate from reporting: a loop that reports every N steps (or once per epoch) is
alive while its training thread runs. Two cheap signals, read without instrumenting the thread
(no `sys.setprofile`): the thread's Python stack (code and line of each frame, from
`sys._current_frames()`) and the default process group's collective sequence number. Either
changing between two samples counts as movement. A thread blocked in one call (a hung
collective, a deadlock, a sleep that never ends, a Python wait loop on one line) changes neither;
a thread training steps changes both.
"""

from __future__ import annotations

import sys
from typing import Any

MAX_FRAMES = 64
"""Innermost frames fingerprinted (deep enough for any training loop, cheap to walk)."""


class ActivityProbe:
    """Counts the samples in which the watched thread had moved since the previous one."""

    def __init__(self) -> None:
        self._thread_id: int | None = None
        self._last: Any = None
        self.count = 0

    def watch(self, thread_id: int | None) -> None:
        """Starts (or stops, with None) watching a thread."""
        self._thread_id, self._last = thread_id, None

    def sample(self) -> int | None:
        """The counter after this sample; None while no thread is watched."""
        thread_id = self._thread_id
        if thread_id is None:
            return None
        fingerprint = (_stack(sys._current_frames().get(thread_id)), _collective_seq())
        if fingerprint != self._last:
            self._last = fingerprint
            self.count += 1
        return self.count


def _stack(frame: Any) -> tuple[tuple[int, int], ...]:
    found = []
    while frame is not None and len(found) < MAX_FRAMES:
        found.append((id(frame.f_code), frame.f_lineno))
        frame = frame.f_back
    return tuple(found)


def _collective_seq() -> int | None:
    """Collectives issued on the default group so far; None without one. Only looked up if
    torch.distributed is already imported (the probe never imports it)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        if not dist.is_initialized():
            return None
        return dist.distributed_c10d._get_default_group()._get_sequence_number_for_group()
    except Exception:  # noqa: BLE001 - a group torn down meanwhile: no reading this time
        return None
