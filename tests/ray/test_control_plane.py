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


def spinning_loop(cfg: dict) -> float:
    """Steps of ~0.2 s with an all-reduce and a report each; in the first attempt every rank
    spins at one line from step 4, as every rank's host thread does in a CUDA spin-wait at
    `.item()` when a collective's kernel hangs (a rank blocked without CPU is found anyway)."""
    ctx = rr.get_context()
    total = torch.zeros(())
    for step in range(1, cfg["steps"] + 1):
        if step == 4 and ctx.attempt == 0:
            never = [False]
            while not never[0]: pass  # noqa: E701 - busy at one stack until interrupted
        value = torch.tensor(float(step * (ctx.world_rank + 1)))
        dist.all_reduce(value)
        total += value
        time.sleep(0.2)
        rr.report({"total": total.item()}, step=step)
    return total.item()


@pytest.mark.timeout(240)
def test_a_rank_spinning_at_one_stack_is_a_hang_once_cpu_alone_outlasts_the_step_timeout(
        ray_session, tmp_path):
    """CPU use at an unchanged stack counts as movement for one step timeout only: the spin is
    then silence, found as a hang and restarted in process. Counted as movement without limit
    (before), the ranks looked alive for as long as they spun: the run never ended."""
    steps = 8
    result = rr.ResilientTrainer(
        spinning_loop, train_loop_config={"steps": steps},
        scaling_config=rr.ScalingConfig(num_workers=2),
        run_config=rr.RunConfig(name="spin", storage_path=str(tmp_path), verbose=False),
        resilience=rr.ResilienceConfig(in_process=rr.InProcessConfig(interrupt_timeout_s=5.0),
                                       step_timeout_s=STEP_TIMEOUT_S),
    ).fit()
    assert result.ok, result.error
    (fault,) = result.faults
    assert fault["cause"] == "hang" and fault["ranks"] == [0, 1]
    assert result.attempts == 2
    assert result.return_values == [3.0 * steps * (steps + 1) / 2] * 2


def stuck_in_c_loop(cfg: dict) -> int:
    """Attempt 0: rank 0 raises at once; rank 1 sleeps in C, where the interrupt's exception
    waits for the call to return. Later attempts return at once."""
    ctx = rr.get_context()
    if ctx.attempt == 0 and ctx.world_rank == 0:
        time.sleep(0.5)
        raise RuntimeError("rank 0 fails first")
    if ctx.attempt == 0:
        time.sleep(cfg["sleep_s"])
    return ctx.attempt


@pytest.mark.timeout(240)
def test_a_rank_that_does_not_unwind_leaves_its_stacks_in_its_log_before_it_is_killed(
        ray_session, tmp_path):
    """Rank 0's exception restarts in process; rank 1, inside a C call, cannot unwind within
    interrupt_timeout_s and is killed and replaced. Before the kill its threads' stacks went to
    its worker log (faulthandler's own thread), so the user sees where it was stuck."""
    sleep_s = 120.0  # far past the test's end: only the kill ends it
    result = rr.ResilientTrainer(
        stuck_in_c_loop, train_loop_config={"sleep_s": sleep_s},
        scaling_config=rr.ScalingConfig(num_workers=2),
        run_config=rr.RunConfig(name="stuck", storage_path=str(tmp_path), verbose=False),
        resilience=rr.ResilienceConfig(
            in_process=rr.InProcessConfig(interrupt_timeout_s=2.0),
            in_job=rr.InJobConfig(num_prestarted_workers=0, heartbeat_timeout_s=30.0)),
    ).fit()
    assert result.ok, result.error
    (fault,) = result.faults
    assert (fault["cause"], fault["ranks"], fault["respawned"]) == ("exception", [0], [1])
    assert result.return_values == [1, 1]
    logs = ray._private.worker._global_node.get_logs_dir_path()
    dumps = []
    for name in os.listdir(logs):
        if name.startswith("worker-") and name.endswith(".err"):
            with open(os.path.join(logs, name), errors="replace") as f:
                text = f.read()
            if "stuck_in_c_loop" in text and "Timeout (" in text:
                dumps.append(text)
    assert len(dumps) == 1, f"{len(dumps)} worker logs hold the stuck rank's stacks"
    stacks = dumps[0][dumps[0].index("Timeout ("):]
    assert 'line' in stacks and "in stuck_in_c_loop" in stacks, stacks[:2000]


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


# --- nothing sent is lost to the end of an attempt or a run ----------------------------------

SLOW_S = 0.4
"""How long the slow receivers below take per call: far longer than the sender needs to return,
so without waiting for its calls the sender would finish before any arrived."""


@ray.remote(max_concurrency=8)
class _SlowSink:
    """A node agent that takes SLOW_S per heartbeat (threaded like the real one, so a question
    from the test is answered at once, not after the beats queued before it)."""

    def __init__(self) -> None:
        self.beats: list[tuple] = []

    def heartbeat(self, rank, attempt, step, step_time, metrics, saves, sent_at, events,
                  activity=None) -> None:
        time.sleep(SLOW_S)
        self.beats.append((rank, step, [e["phase"] for e in events]))

    def taken(self) -> list[tuple]:
        return self.beats


class _Reports:
    """A rank session that reported steps 1.. and one start-up phase, drained once per beat."""

    def __init__(self) -> None:
        self.step = 0

    def drain(self, final: bool = False):
        self.step += 1
        events = [{"phase": "imports", "t_start": 0.0, "t_end": 1.0}] if self.step == 1 else []
        return [], self.step, None, [], events


@pytest.mark.timeout(60)
def test_a_ranks_beats_reach_its_agent_before_the_forwarder_stops(ray_session):
    from ray_resilience._internal.rank.progress import ProgressForwarder  # noqa: PLC0415

    sink, reports = _SlowSink.remote(), _Reports()
    assert ray.get(sink.taken.remote(), timeout=30) == []  # up, as a rank's agent is
    forwarder = ProgressForwarder(sink, reports, rank=1, attempt=0, interval_s=0.05)
    forwarder.start()
    time.sleep(0.3)  # several beats sent, the first still inside the sink
    forwarder.stop()
    sent = reports.step - 1  # the final drain is returned to the caller, not sent
    beats = ray.get(sink.taken.remote(), timeout=30)
    assert sent >= 3
    assert sorted(b[1] for b in beats) == list(range(1, sent + 1))
    assert min(beats)[2] == ["imports"], "the start-up phase never reached the agent"


@ray.remote(max_concurrency=4)
class _SlowSupervisor:
    """A supervisor that takes SLOW_S to fold each batch."""

    def __init__(self) -> None:
        self.folded: list = []

    def progress(self, batch) -> None:
        time.sleep(SLOW_S)
        self.folded.append(batch)

    def count(self) -> int:
        return len(self.folded)


@pytest.mark.timeout(60)
def test_an_agents_forwarded_batches_are_folded_before_its_drain_returns(ray_session):
    from ray_resilience._internal.control.node_agent import start_agent  # noqa: PLC0415

    supervisor = _SlowSupervisor.remote()
    assert ray.get(supervisor.count.remote(), timeout=30) == 0
    agent = start_agent(supervisor, ray.get_runtime_context().get_node_id(), 0.05)
    try:
        ray.get(agent.heartbeat.remote(0, 0, 3, 0.1, [], [], time.time(),
                                       [{"phase": "imports", "t_start": 0.0, "t_end": 1.0}]),
                timeout=30)
        deadline = time.monotonic() + 10
        while ray.get(agent.__ray_call__.remote(lambda a: a.sent), timeout=30) == 0:
            assert time.monotonic() < deadline, "the agent never forwarded its batch"
            time.sleep(0.02)
        ray.get(agent.take.remote(), timeout=30)  # the supervisor's drain at a run's end
        assert ray.get(supervisor.count.remote(), timeout=30) == 1
    finally:
        ray.kill(agent)
