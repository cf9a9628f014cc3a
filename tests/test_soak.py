"""Soak: 100 consecutive in-process restarts without leaking memory, descriptors or threads."""

from __future__ import annotations

import pytest

import ray_resilience as rr
from tests import soak_loop

RESTARTS = 100
WARM = 5  # the first attempts fill caches (imports, allocator pools): measure from here


@pytest.mark.timeout(600)
def test_hundred_inprocess_restarts_leak_nothing(ray_session, tmp_path):
    result = rr.ResilientTrainer(
        soak_loop.soak, train_loop_config={"restarts": RESTARTS},
        scaling_config=rr.ScalingConfig(num_workers=2),
        run_config=rr.RunConfig(name="soak", storage_path=str(tmp_path), verbose=False),
        resilience=rr.ResilienceConfig(in_process=rr.InProcessConfig(
            max_restarts=RESTARTS, health_check=rr.Compose()))).fit()
    assert result.ok, result.error
    assert result.attempts == RESTARTS + 1
    assert [v["pid"] for v in result.return_values] == result.worker_pids
    for value in result.return_values:
        samples = value["samples"]
        start, end = samples[WARM], samples[RESTARTS]
        assert end["rss"] < start["rss"] * 1.10, (start, end)
        assert end["fds"] <= start["fds"], (start, end)
        assert end["threads"] <= start["threads"], (start, end)
