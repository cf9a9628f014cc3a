"""A supervisor on a dummy worker group with a fake clock, and a callback that records events."""

from __future__ import annotations

from typing import Any

import ray_resilience as rr
from ray_resilience._internal.supervisor.supervisor import Supervisor
from ray_resilience.callbacks import Callback
from tests.support.dummy_group import Act, DummyWorkerGroup, FakeClock


class Recorder(Callback):
    """Every event the supervisor delivers, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("on_") and name in dir(Callback):
            return lambda event: self.events.append((name, event))
        return super().__getattribute__(name)

    def of(self, hook: str) -> list[Any]:
        return [e for h, e in self.events if h == hook]

    def transitions(self) -> list[tuple[str, str]]:
        return [(e.previous, e.state) for e in self.of("on_state_change")]


def both_rungs(**in_job: Any) -> rr.ResilienceConfig:
    return rr.ResilienceConfig(in_process=rr.InProcessConfig(),
                               in_job=rr.InJobConfig(num_prestarted_workers=0, **in_job),
                               step_timeout_s=1.0, first_step_timeout_s=2.0)


def make(script: dict[tuple[int, int], Act], resilience: rr.ResilienceConfig, *,
         world_size: int = 2, no_capacity: tuple[int, ...] = (),
         callbacks: tuple[Callback, ...] = ()) -> tuple[Supervisor, DummyWorkerGroup, Recorder]:
    clock = FakeClock()
    group = DummyWorkerGroup(clock, script, world_size=world_size, no_capacity=no_capacity)
    recorder = Recorder()
    sup = Supervisor(train_fn=b"", train_config=None,
                     scaling=rr.ScalingConfig(num_workers=world_size), resilience=resilience,
                     run_name="unit", run_dir="/tmp/unit", env_vars={},
                     callbacks=[recorder, *callbacks], worker_group_factory=group.factory,
                     clock=clock)
    group.supervisor = sup
    return sup, group, recorder
