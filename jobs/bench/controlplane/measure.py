"""One size of the control-plane benchmark: a real supervisor over N virtual ranks, driven
through a steady window, dead-rank, hung-rank and lost-node trials, and a long run for memory.
"""

from __future__ import annotations

import functools
import os
import random
import time
from collections.abc import Callable
from typing import Any

import psutil
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from .probe import Probe


class Watch:
    """CPU and resident memory of one actor's process, from outside (psutil)."""

    def __init__(self, actor: Any) -> None:
        self.pid = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=60)
        self._proc = psutil.Process(self.pid)
        self._cpu, self._t = self.cpu(), time.monotonic()

    def cpu(self) -> float:
        times = self._proc.cpu_times()
        return times.user + times.system

    def rss_mb(self) -> float:
        return self._proc.memory_info().rss / 2**20

    def restart(self) -> None:
        self._cpu, self._t = self.cpu(), time.monotonic()

    def core_fraction(self) -> float:
        """CPU seconds per wall second since `restart` (1.0 = one core)."""
        return (self.cpu() - self._cpu) / max(time.monotonic() - self._t, 1e-9)


def counters(supervisor: Any) -> tuple[int, int, int | None]:
    """(batches, reports, global step) the supervisor has folded."""
    return ray.get(supervisor.__ray_call__.remote(
        lambda self: (self.record.num_batches, self.record.num_reports, self.record.global_step)),
        timeout=60)


class Events:
    """Reads the probe's events as they come."""

    def __init__(self, probe: Any) -> None:
        self._probe, self._seen = probe, 0

    def wait_for(self, match: Callable[[dict[str, Any]], bool], timeout_s: float,
                 ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for i, event in enumerate(ray.get(self._probe.since.remote(self._seen)), self._seen):
                if match(event):
                    self._seen = i + 1
                    return event
            time.sleep(0.02)
        raise TimeoutError(f"no matching event within {timeout_s} s")

    def skip(self) -> None:
        self._seen += len(ray.get(self._probe.since.remote(self._seen)))


def steady(supervisor: Any, watch: Watch, window_s: float) -> dict[str, float]:
    """Supervisor CPU, memory and message rate while training runs without faults."""
    b0, r0, s0 = counters(supervisor)
    watch.restart()
    time.sleep(window_s)
    b1, r1, s1 = counters(supervisor)
    return {"supervisor_cpu_core_fraction": watch.core_fraction(),
            "supervisor_rss_mb": watch.rss_mb(), "batches_per_s": (b1 - b0) / window_s,
            "reports_per_s": (r1 - r0) / window_s,
            "steps_per_s": ((s1 or 0) - (s0 or 0)) / window_s}


def trial(events: Events, inject: Callable[[], float], cause: str | None, timeout_s: float,
          ) -> dict[str, Any]:
    """Injects one fault; returns its detection latency and the time to decide and launch the
    recovery (detection to the new attempt's run calls issued), once the new attempt steps.
    `cause`: the one expected (None: any, recorded)."""
    events.skip()
    t0 = inject()
    fault = events.wait_for(lambda e: e["hook"] == "fault", timeout_s)
    if cause is not None and fault["cause"] != cause:
        raise RuntimeError(f"expected a {cause} fault, the supervisor saw {fault}")
    running = events.wait_for(lambda e: e["hook"] == "state" and e["state"] == "running", 120)
    events.wait_for(lambda e: e["hook"] == "step" and e["attempt"] == running["attempt"], 120)
    return {"detect_s": fault["t"] - t0, "launch_s": running["t"] - fault["t"],
            "cause": fault["cause"]}


def trials(events: Events, hosts_of: Callable[[int], Any], world: int, count: int,
           kind: str, timeout_s: float, seed: int) -> list[dict[str, float]]:
    """`count` dead-rank ("died") or hung-rank ("hang") trials on random ranks."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        rank = rng.randrange(world)
        host = hosts_of(rank)
        if kind == "hang":
            inject, cause = functools.partial(_freeze, host, rank), "hang"
        else:
            inject, cause = functools.partial(_kill, host, rank), "actor_died"
        out.append(guarded(events, inject, cause, timeout_s))
    return out


def guarded(events: Events, inject: Callable[[], float], cause: str | None, timeout_s: float,
            ) -> dict[str, Any]:
    """`trial`, or `{"error": ...}` when it fails (a finding kept in the results), once the run
    steps again."""
    try:
        return trial(events, inject, cause, timeout_s)
    except (RuntimeError, TimeoutError) as exc:
        settle(events)
        return {"error": str(exc)[:300]}


def _freeze(host: Any, rank: int) -> float:
    return ray.get(host.freeze.remote(rank))


def _kill(host: Any, rank: int) -> float:
    return ray.get(host.end.remote([rank], "died"))


def settle(events: Events, timeout_s: float = 180.0) -> None:
    """Waits until the run steps again after an unexpected event."""
    try:
        events.wait_for(lambda e: e["hook"] == "step", timeout_s)
    except TimeoutError:
        pass


def memory_run(supervisor: Any, watch: Watch, steps: int, timeout_s: float,
               ) -> list[tuple[int, float]]:
    """(global step, supervisor RSS MB) samples until the run passes `steps` more steps."""
    _, _, start = counters(supervisor)
    start = start or 0
    samples, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _, _, step = counters(supervisor)
        samples.append(((step or 0) - start, watch.rss_mb()))
        if (step or 0) - start >= steps:
            break
        time.sleep(2.0)
    return samples


def new_probe() -> Any:
    """On the driver's node: it must outlive every node the benchmark removes."""
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return ray.remote(Probe).options(num_cpus=0, max_concurrency=4,
                                     scheduling_strategy=here).remote()
