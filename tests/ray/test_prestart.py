"""Prestarted Ray workers: the raylet boots an idle worker when asked, and the next actor of the
job runs in it instead of a new process (what a respawn without a warm spare gains); asked for
with the ranks' runtime env, it imports torch at idle priority before a rank takes it.

Real raylet of the session's local Ray; processes are found by the title Ray gives idle workers.
"""

from __future__ import annotations

import os
import time

import psutil
import pytest
import ray
from ray import cloudpickle

from ray_resilience import InJobConfig
from ray_resilience._internal.priority import rank_niceness
from ray_resilience._internal.rank import preimport
from ray_resilience._internal.rank.actor import WorkerActor
from ray_resilience._internal.worker_group.prestart import WorkerPrestarter
from ray_resilience.errors import ConfigError
from tests.support.procfs import SCHED_IDLE, thread_policies

pytestmark = pytest.mark.timeout(90)


def _idle_workers() -> set[int]:
    found = set()
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if cmdline and cmdline[0].startswith("ray::IDLE"):
            found.add(proc.info["pid"])
    return found


@ray.remote(num_cpus=0)
class _Probe:
    def pid(self) -> int:
        return os.getpid()


def _settled_idle_workers(quiet_s: float = 1.5, timeout_s: float = 20.0) -> set[int]:
    """The idle workers once none appeared for `quiet_s` (Ray boots some when a driver starts)."""
    deadline = time.monotonic() + timeout_s
    seen, since = _idle_workers(), time.monotonic()
    while time.monotonic() - since < quiet_s and time.monotonic() < deadline:
        time.sleep(0.2)
        now = _idle_workers()
        if now - seen:
            since = time.monotonic()
        seen = now
    return seen


def test_raylet_boots_an_idle_worker_that_the_next_actor_takes(ray_session):
    node = ray.get_runtime_context().get_node_id()
    before = _settled_idle_workers()
    prestarter = WorkerPrestarter(1)
    assert prestarter.request([node, node]) == [node] and prestarter.requested == {node: 1}
    booted = _booted_after(before)
    assert booted, "the raylet started no idle worker"
    idle = _idle_workers()
    probe = _Probe.remote()
    try:
        assert ray.get(probe.pid.remote(), timeout=30) in idle  # no new process for it
    finally:
        ray.kill(probe)


def _booted_after(before: set[int], timeout_s: float = 30) -> set[int]:
    deadline, booted = time.monotonic() + timeout_s, set()
    while not booted and time.monotonic() < deadline:
        time.sleep(0.2)
        booted = _idle_workers() - before
    return booted


def _idle_class_threads(pid: int) -> list[int]:
    """Threads of `pid` scheduled in SCHED_IDLE."""
    return [tid for tid, policy in thread_policies(pid).items() if policy == SCHED_IDLE]


def _rank_actor(env: dict[str, str]):
    return ray.remote(WorkerActor).options(num_cpus=0, runtime_env={"env_vars": env}).remote(
        cloudpickle.dumps(lambda config: None), None, None)


@pytest.mark.slow  # ~25 s
def test_a_rank_process_booted_ahead_imports_torch_at_idle_priority_for_the_next_rank(ray_session):
    node = ray.get_runtime_context().get_node_id()
    key = f"preimport-test-{os.getpid()}-{time.monotonic_ns()}"
    env = {**preimport.rank_env_vars({"RR_TEST_RANK_ENV": "1"}, key), **rank_niceness()}
    first = _rank_actor(env)
    actors = [first]
    try:
        info = ray.get(first.info.remote(), timeout=60)
        # The switch is off: a rank's first process imports on its own, at normal priority.
        assert "started" not in info["preimport"] and info["preimport"]["waited_s"] == 0.0
        serialized = info["runtime_env"]
        assert preimport.HOOK in serialized and "RR_TEST_RANK_ENV" in serialized
        before = _settled_idle_workers()
        assert preimport.switch(key, True)
        assert WorkerPrestarter(1).request([node], serialized) == [node]
        booted = _booted_after(before)
        assert booted, "the raylet started no idle worker"
        # Seen from outside: the booted process runs a thread in the SCHED_IDLE class.
        deadline = time.monotonic() + 30
        while not any(_idle_class_threads(p) for p in booted) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert any(_idle_class_threads(p) for p in booted), "no idle-priority import thread"
        # ... and starts at the ranks' nice 0 (Ray's workers start at 15 otherwise).
        assert {psutil.Process(p).nice() for p in booted} == {0}
        asked_at = time.time()
        second = _rank_actor(env)
        actors.append(second)
        info = ray.get(second.info.remote(), timeout=60)
        assert info["pid"] in booted  # the rank took the process booted for it
        pre = info["preimport"]
        assert "error" not in pre, pre
        assert pre["started"] < asked_at  # it began before this rank was asked for
        assert pre["policy"] == "idle" and pre["seconds"] > 0.1  # it did the imports itself
        # A process booted without the rank env (another actor of the job) never imports.
        plain = _Probe.options(runtime_env={"env_vars": {"RR_TEST_RANK_ENV": "1"}}).remote()
        actors.append(plain)
        assert ray.get(plain.pid.remote(), timeout=60) not in booted
        # One more that no rank takes: it exits once the run is over (the switch goes off).
        before = _settled_idle_workers()
        assert WorkerPrestarter(1).request([node], serialized) == [node]
        unused = _booted_after(before)
        assert unused, "the raylet started no idle worker"
        time.sleep(1.0)
        assert preimport.switch(key, False)
        deadline = time.monotonic() + 30
        while any(psutil.pid_exists(p) for p in unused) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not any(psutil.pid_exists(p) for p in unused), "an unused prestarted process stayed"
        assert ray.get(second.info.remote(), timeout=30)["pid"] in booted  # the rank's stays
    finally:
        preimport.switch(key, False)
        for actor in actors:
            ray.kill(actor)


@ray.remote(num_cpus=0)
class _EnvProbe:
    def env(self, name: str) -> str | None:
        return os.environ.get(name)


def test_the_jobs_own_setup_hook_still_runs_in_rank_processes(ray_session, monkeypatch):
    # As the supervisor sees it when the job was started with a worker_process_setup_hook.
    monkeypatch.setenv(preimport.HOOK_ENV, "tests.support.hook_probe.mark")
    env = preimport.rank_env_vars(None, "preimport-test-chain")
    assert env[preimport.HOOK_ENV] == preimport.HOOK
    assert env[preimport.USER_HOOK_ENV] == "tests.support.hook_probe.mark"
    probe = _EnvProbe.options(runtime_env={"env_vars": env}).remote()
    try:
        assert ray.get(probe.env.remote("RR_HOOK_PROBE"), timeout=60) == "ran"
    finally:
        ray.kill(probe)


def test_disabled_prestarter_sends_nothing(ray_session):
    node = ray.get_runtime_context().get_node_id()
    for prestarter in (WorkerPrestarter(0), WorkerPrestarter(1, enabled=False)):
        sent: list[list[str]] = []
        prestarter._send = lambda nodes, env, sent=sent: sent.append(nodes)  # to the raylet
        assert prestarter.request([node]) == [] and sent == [] and prestarter.requested == {}


def test_unreachable_raylet_turns_it_off_without_raising(ray_session):
    def refused(nodes: list[str], env: str | None) -> None:
        raise OSError("connection refused")

    prestarter = WorkerPrestarter(1)
    prestarter._send = refused
    assert prestarter.request(["some-node"]) == [] and not prestarter.enabled
    prestarter._send = lambda nodes, env: pytest.fail("asked again after turning itself off")
    assert prestarter.request(["some-node"]) == []


def test_negative_count_is_a_config_error():
    with pytest.raises(ConfigError, match="InJobConfig.num_prestarted_workers"):
        InJobConfig(num_prestarted_workers=-1)
