"""Prestarted Ray workers: the raylet boots an idle worker when asked, and the next actor of the
job runs in it instead of a new process (what a respawn without a warm spare gains).

Real raylet of the session's local Ray; processes are found by the title Ray gives idle workers.
"""

from __future__ import annotations

import os
import time

import psutil
import pytest
import ray

from ray_resilience import InJobConfig
from ray_resilience.errors import ConfigError
from ray_resilience._internal.prestart import WorkerPrestarter

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
    deadline, booted = time.monotonic() + 30, set()
    while not booted and time.monotonic() < deadline:
        time.sleep(0.2)
        booted = _idle_workers() - before
    assert booted, "the raylet started no idle worker"
    idle = _idle_workers()
    probe = _Probe.remote()
    try:
        assert ray.get(probe.pid.remote(), timeout=30) in idle  # no new process for it
    finally:
        ray.kill(probe)


def test_disabled_prestarter_sends_nothing(ray_session):
    node = ray.get_runtime_context().get_node_id()
    for prestarter in (WorkerPrestarter(0), WorkerPrestarter(1, enabled=False)):
        sent: list[list[str]] = []
        prestarter._send = sent.append  # what would go to the raylet
        assert prestarter.request([node]) == [] and sent == [] and prestarter.requested == {}


def test_unreachable_raylet_turns_it_off_without_raising(ray_session):
    def refused(nodes: list[str]) -> None:
        raise OSError("connection refused")

    prestarter = WorkerPrestarter(1)
    prestarter._send = refused
    assert prestarter.request(["some-node"]) == [] and not prestarter.enabled
    prestarter._send = lambda nodes: pytest.fail("asked again after turning itself off")
    assert prestarter.request(["some-node"]) == []


def test_negative_count_is_a_config_error():
    with pytest.raises(ConfigError, match="InJobConfig.num_prestarted_workers"):
        InJobConfig(num_prestarted_workers=-1)
