"""Soak: consecutive in-process restarts without leaking memory, descriptors or threads; with
checkpoints and the local tier on, in every process of the run and in /dev/shm as well.

Resident memory: the issue's bound is < 10% growth over the 100 restarts. Measured here
(2026-12-01): the live heap grows ~2 MB in all; before teardown called `malloc_trim`, glibc kept
each attempt's freed memory resident and a worker grew ~15%; now 5-8% (most of it over the first
~30 restarts, as Ray's executor threads and their arenas appear), and the second half must be
flat (< 3%), where a per-restart leak would show as steady growth. Descriptors must be back at
their level (from restart 5 on: one or two open once during the first restarts) and flat over
the second half; in two suite runs of several, one more descriptor opened once, at restart ~12,
and stayed (a lazily opened connection): one is tolerated, a leak would show as growth; the
assertion lists the kinds that changed. Our own threads must be back at their level exactly;
"Dummy-N" threads are Ray's C++ executor threads of the threaded actor (at most
WORKER_MAX_CONCURRENCY), not ours.
"""

from __future__ import annotations

import collections
import os

import pytest

import ray_resilience as rr
from ray_resilience._internal.constants import WORKER_MAX_CONCURRENCY
from ray_resilience.policy import Compose
from tests.support import soak_loop

RESTARTS = 100
WARM = 50


def _kinds(sample: dict) -> dict[str, int]:
    """Descriptors by kind ("socket", "pipe", "anon_inode:[eventpoll]", a path's folder)."""
    kinds = collections.Counter()
    for entry in sample["fd_targets"]:
        target = entry.split("->", 1)[1]
        kinds[target.split(":")[0] if target.startswith(("socket:", "pipe:")) else
              target if target.startswith("anon_inode") else os.path.dirname(target)] += 1
    return dict(kinds)


def _own_threads(sample: dict) -> list[str]:
    return [n for n in sample["thread_names"] if not n.startswith("Dummy-")]


@pytest.mark.slow  # 0.5-1 min; tests/process/test_abort.py's 10-restart soak runs by default
@pytest.mark.timeout(600)
def test_hundred_inprocess_restarts_leak_nothing(ray_session, tmp_path):
    result = rr.ResilientTrainer(
        soak_loop.soak, train_loop_config={"restarts": RESTARTS},
        scaling_config=rr.ScalingConfig(num_workers=2),
        run_config=rr.RunConfig(name="soak", storage_path=str(tmp_path), verbose=False),
        resilience=rr.ResilienceConfig(in_process=rr.InProcessConfig(
            max_restarts=RESTARTS, health_check=Compose()))).fit()
    assert result.ok, result.error
    assert result.attempts == RESTARTS + 1
    assert [v["pid"] for v in result.return_values] == result.worker_pids
    for value in result.return_values:
        samples = value["samples"]
        first, settled, warm, end = samples[1], samples[5], samples[WARM], samples[RESTARTS]
        assert end["rss"] < first["rss"] * 1.10, (first["rss"], end["rss"])
        assert end["rss"] < warm["rss"] * 1.03, (warm["rss"], end["rss"])
        # 1-2 descriptors open once during the first restarts (Ray/gloo, lazily), then never more.
        before, after = _kinds(settled), _kinds(end)
        # A leak grows with the restarts (the one fixed earlier: 5 descriptors every ~4 restarts,
        # +125 here); one descriptor opened once, late, is a lazy connection, not a leak.
        assert settled["fds"] <= end["fds"] <= settled["fds"] + 1 and end["fds"] == warm["fds"], {
            "kinds that changed (restart 5 -> 100)": {
                k: (before.get(k, 0), after.get(k, 0)) for k in set(before) | set(after)
                if before.get(k, 0) != after.get(k, 0)},
            "count per restart": {a: s["fds"] for a, s in sorted(samples.items())
                                  if a and s["fds"] != samples[a - 1]["fds"]}}
        assert len(_own_threads(end)) == len(_own_threads(first)), (first, end)
        assert end["threads"] - len(_own_threads(end)) <= WORKER_MAX_CONCURRENCY


STATE_BYTES = 2 * 2**20
"""What one attempt's model and optimizer hold on a rank (the tiny model, sharded over two
ranks: ~0.4 MB of parameters, twice that of AdamW moments, a snapshot slot): an attempt leaked
per restart grows a rank by at least this much each time."""


def _half_growth(series: list[int]) -> tuple[int, int]:
    """(largest value of the second half - largest of the first half, the first half's)."""
    half = len(series) // 2
    return max(series[half:]) - max(series[:half]), max(series[:half])


# Both slow: ~2 min at 20 restarts. Open: after the local tier moved off the training thread,
# rank 1's RSS grew 10.9 MB between the halves of a 20-restart run (bound 10 MB).
@pytest.mark.parametrize("restarts", [
    pytest.param(20, marks=pytest.mark.slow),
    pytest.param(100, marks=[pytest.mark.slow, pytest.mark.timeout(900)])])
@pytest.mark.timeout(300)
def test_restarts_with_checkpoints_reach_a_plateau_in_every_process(ray_session, tmp_path,
                                                                   restarts):
    """Each attempt restores the previous one's step from the local tier, saves its own (and
    waits for it to be durable), then faults. Sampled at every attempt's start: a leak per
    restart grows the second half above the first half's plateau. Descriptors must not grow at
    all after the first half; resident memory by less than half an attempt's state per restart
    (a leaked attempt costs a whole one); the local tier's files not at all (two per rank,
    sized once)."""
    result = rr.ResilientTrainer(
        soak_loop.soak, train_loop_config={"restarts": restarts, "checkpoint": True},
        scaling_config=rr.ScalingConfig(num_workers=2),
        run_config=rr.RunConfig(name=f"soak-ckpt-{restarts}", storage_path=str(tmp_path),
                                verbose=False),
        resilience=rr.ResilienceConfig(
            in_process=rr.InProcessConfig(max_restarts=restarts, health_check=Compose()),
            checkpoint=rr.CheckpointConfig(interval_steps=1))).fit()
    assert result.ok, result.error
    assert result.attempts == restarts + 1
    assert [v["resumed_from"] for v in result.return_values] == [restarts] * 2
    bound = restarts // 2 * STATE_BYTES // 2
    growth = {}
    for rank, value in enumerate(result.return_values):
        samples = [value["samples"][a] for a in range(1, restarts + 1)]
        growth[f"rank{rank}"] = {k: _half_growth([s[k] for s in samples]) for k in ("rss", "fds")}
    samples = [result.return_values[0]["samples"][a] for a in range(1, restarts + 1)]
    processes = set(samples[0]["control_plane"])
    assert {p.split(":")[0] for p in processes} == {"Supervisor", "CommitCoordinator",
                                                    "CheckpointWriter"}, processes
    assert all(set(s["control_plane"]) == processes for s in samples)  # none was replaced
    for process in processes:
        growth[process] = {k: _half_growth([s["control_plane"][process][k] for s in samples])
                           for k in ("rss", "fds")}
    growth["local tier"] = {k: _half_growth([s["local"][k] for s in samples])
                            for k in ("files", "bytes")}
    print(f"soak growth (second half over first, first half's peak): {growth}")
    assert all(g["fds"][0] <= 0 for n, g in growth.items() if "fds" in g), growth
    assert all(g["rss"][0] < bound for n, g in growth.items() if "rss" in g), (bound, growth)
    assert growth["local tier"]["files"] == (0, 4) and growth["local tier"]["bytes"][0] == 0
