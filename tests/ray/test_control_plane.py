"""The control plane end to end: liveness without reports, a frozen process, a hang on the
store's host, and the loss of a node agent; every fault run ends bit-equal to no faults."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import ray
import torch
import torch.distributed as dist

import ray_resilience as rr
from ray_resilience._internal.control.node_agent import AGENT_NAME_PREFIX
from ray_resilience.testing import Fault, FaultPlan
from tests.support import workload

STEPS = 12
COARSE_STEPS = 20
REPORT_EVERY = 10
STEP_TIMEOUT_S = 3.0
"""Shorter than the coarse loop's report cadence (10 s): liveness cannot come from reports."""


@pytest.fixture(scope="module")
def clean(clean_run):
    return clean_run(2, STEPS)


def coarse_loop(cfg: dict) -> float:
    """Steps of 1 s (some compute, an all-reduce, then waiting out the second: a data loader, a
    slower peer), a report every 10 steps."""
    ctx = rr.get_context()
    total = torch.zeros(())
    weight = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    for step in range(1, cfg["steps"] + 1):
        t0 = time.monotonic()
        x = torch.ones(256, 256)
        for _ in range(20):
            x = torch.tanh(x @ weight)
        value = torch.tensor(float(step * (ctx.world_rank + 1)))
        dist.all_reduce(value)
        total += value
        time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
        if step % REPORT_EVERY == 0:
            rr.report({"total": total.item()}, step=step)
    return total.item()


def _coarse(tmp_path, name: str, plan: FaultPlan | None) -> rr.Result:
    return rr.ResilientTrainer(
        coarse_loop, train_loop_config={"steps": COARSE_STEPS},
        scaling_config=rr.ScalingConfig(num_workers=2),
        run_config=rr.RunConfig(name=name, storage_path=str(tmp_path), verbose=False),
        resilience=rr.ResilienceConfig(in_process=rr.InProcessConfig(), fault_plan=plan,
                                       step_timeout_s=STEP_TIMEOUT_S),
    ).fit()


EXPECTED_TOTAL = 3.0 * COARSE_STEPS * (COARSE_STEPS + 1) / 2  # sum of step x (1 + 2)


@pytest.mark.slow  # ~35 s; 30 s of coarse steps
@pytest.mark.timeout(240)
def test_a_loop_reporting_every_ten_seconds_is_alive_between_reports(ray_session, tmp_path):
    result = _coarse(tmp_path, "coarse", None)
    assert result.ok, result.error
    assert result.faults == [] and result.attempts == 1
    assert result.return_values == [EXPECTED_TOTAL] * 2
    assert [(m["step"], m["rank"]) for m in result.metrics_history] == [
        (10, 0), (10, 1), (20, 0), (20, 1)]


@pytest.mark.slow  # ~45 s; hangs run by default in test_inprocess.py and the SIGSTOP test below
@pytest.mark.timeout(300)
def test_a_genuine_hang_in_that_loop_is_detected_within_the_step_timeout(ray_session, tmp_path):
    plan = FaultPlan.explicit([Fault(step=REPORT_EVERY, rank=1, kind="hang")])
    result = _coarse(tmp_path, "coarse-hang", plan)
    assert result.ok, result.error
    (fault,) = result.faults
    assert fault["cause"] == "hang" and 1 in fault["ranks"]
    # Detected once the hung thread was still for the step timeout (plus heartbeat batching
    # and the supervisor's poll); generous on a loaded machine, far below a report interval.
    assert STEP_TIMEOUT_S <= fault["t_detect"] - fault["t_fault"] <= STEP_TIMEOUT_S + 4.0
    assert result.return_values == [EXPECTED_TOTAL] * 2


def _respawn(plan: FaultPlan | None, step_timeout_s: float = STEP_TIMEOUT_S,
             **in_job) -> rr.ResilienceConfig:
    in_job.setdefault("heartbeat_timeout_s", 5.0)
    return rr.ResilienceConfig(
        in_process=rr.InProcessConfig(interrupt_timeout_s=2.0),
        in_job=rr.InJobConfig(num_prestarted_workers=0, **in_job), fault_plan=plan,
        step_timeout_s=step_timeout_s, first_step_timeout_s=60.0)


@pytest.mark.timeout(300)
def test_a_sigstopped_rank_loses_its_heartbeat_and_is_respawned(clean, token_data_dir,
                                                                 tmp_path):
    """The whole process frozen (SIGSTOP): its side thread sends nothing either, so it is lost
    after the heartbeat timeout, killed and replaced. The step timeout is longer here: with a
    shorter one the frozen rank and its waiting peer are a hang first (also repaired)."""
    result = workload.fit(token_data_dir, str(tmp_path), "sigstop", max_steps=STEPS,
                          sleep_s=0.2, stop_at=(1, 4), resilience=_respawn(None, 15.0))
    assert result.ok, result.error
    (fault,) = result.faults
    assert (fault["cause"], fault["ranks"], fault["respawned"]) == ("unresponsive", [1], [1])
    assert result.return_values[1]["pid"] not in clean.worker_pids
    for r in range(2):
        workload.assert_bit_equal(result.return_values[r]["state"], clean.return_values[r]["state"])


@pytest.mark.slow  # ~20 s; a variant of the SIGSTOP test
@pytest.mark.timeout(300)
def test_a_hang_on_rank_zero_the_store_host_is_recovered(clean, token_data_dir, tmp_path):
    plan = FaultPlan.explicit([Fault(step=5, rank=0, kind="hang")])
    result = workload.fit(token_data_dir, str(tmp_path), "hang0", max_steps=STEPS, sleep_s=0.2,
                          resilience=_respawn(plan))
    assert result.ok, result.error
    assert [f["cause"] for f in result.faults] == ["hang"] and 0 in result.faults[0]["ranks"]
    for r in range(2):
        workload.assert_bit_equal(result.return_values[r]["state"], clean.return_values[r]["state"])


def _agents() -> list:
    return [ray.get_actor(a["name"], namespace=a["namespace"])
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith(AGENT_NAME_PREFIX)]


def _kill_agent_when_up(stop: threading.Event, killed: list[tuple]) -> None:
    while not stop.is_set():
        agents = _agents()
        if agents:
            time.sleep(2.0)  # training under way
            pid = ray.get(agents[0].ping.remote(), timeout=30)
            os.kill(pid, signal.SIGKILL)
            killed.append((agents[0], pid))
            return
        time.sleep(0.2)


@pytest.mark.slow  # ~20 s
@pytest.mark.timeout(300)
def test_a_dead_node_agent_is_restarted_and_the_ranks_train_on(clean, token_data_dir, tmp_path):
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_agent_when_up, args=(stop, killed), daemon=True)
    killer.start()
    try:
        result = workload.fit(token_data_dir, str(tmp_path), "agent", max_steps=STEPS,
                              sleep_s=0.5, resilience=_respawn(None, heartbeat_timeout_s=30.0))
    finally:
        stop.set()
        killer.join(10)
    assert killed, "the node agent never came up"
    assert result.ok, result.error
    assert result.faults == [] and result.attempts == 1
    assert result.control["agent_restarts"] >= 1
    for r in range(2):
        workload.assert_bit_equal(result.return_values[r]["state"], clean.return_values[r]["state"])
