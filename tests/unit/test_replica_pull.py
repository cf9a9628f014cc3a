"""Replica copies are paced (`service/replica_pull.py`): the chunks a writer pulls never arrive
faster than `CheckpointConfig.replica_bytes_per_s`. A fake clock: no timing in a unit test."""

from __future__ import annotations

import pytest

from ray_resilience._internal.checkpoint.service import replica_pull

pytestmark = pytest.mark.timeout(30)


class _Clock:
    def __init__(self) -> None:
        self.now, self.slept = 0.0, []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_chunks_are_spaced_to_the_rate(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(replica_pull.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(replica_pull.time, "sleep", clock.sleep)
    pacer = replica_pull.Pacer(rate=100.0)  # bytes per second
    for _ in range(4):
        clock.now += 0.1  # each chunk takes 0.1 s to arrive
        pacer.sent(50)  # 50 bytes: 0.5 s at the rate
    assert clock.now == pytest.approx(2.0)  # 200 bytes at 100 B/s, never faster
    assert pacer.slept_s == pytest.approx(1.6) and len(clock.slept) == 4


def test_no_rate_never_sleeps(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(replica_pull.time, "sleep", clock.sleep)
    pacer = replica_pull.Pacer(rate=None)
    pacer.sent(10**12)
    assert clock.slept == [] and pacer.total == 10**12
