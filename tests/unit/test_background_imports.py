"""When the writers' DCP import and the prestarted workers' torch import start
(`ResilienceConfig.background_imports`): the decision from each node's ranks, and the supervisor
acting on it, on the dummy worker group with a fake clock. No Ray, no processes."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import ray_resilience as rr
from ray_resilience._internal.worker_group.imports import BackgroundImports, idle_cores_reason
from ray_resilience.errors import ConfigError
from tests.support.dummy_group import Act, DummyWorkerGroup
from tests.support.supervisor_harness import both_rungs, make

pytestmark = pytest.mark.timeout(30)


def _ranks(node: str, count: int, *, cpus: int, gpus: bool) -> list[dict[str, Any]]:
    return [{"node_id": node, "cpus": cpus, "gpu_ids": [str(i)] if gpus else []}
            for i in range(count)]


def test_gpu_ranks_on_a_node_with_cores_to_spare_import_at_start():
    # A p5.48xlarge: 8 GPU ranks on 192 vCPUs.
    reason = idle_cores_reason(_ranks("p5", 8, cpus=192, gpus=True))
    assert reason is not None and "174 of its cores idle" in reason


@pytest.mark.parametrize("info", [
    _ranks("cpu", 2, cpus=96, gpus=False),  # CPU ranks: torch's threads take every core
    _ranks("small", 2, cpus=5, gpus=True),  # 2 GPU ranks need 2 x 2 + 2 = 6 cores
    _ranks("big", 4, cpus=64, gpus=True) + _ranks("small", 1, cpus=3, gpus=True),
    [{"node_id": "n", "gpu_ids": ["0"]}],  # a rank that did not say how many cores it has
    [],
], ids=["cpu-ranks", "few-cores", "one-small-node", "cores-unknown", "no-ranks"])
def test_a_node_the_ranks_may_keep_busy_defers_the_imports(info):
    assert idle_cores_reason(info) is None


def test_the_smallest_node_that_fits_counts_its_cores_exactly():
    assert idle_cores_reason(_ranks("g5", 1, cpus=4, gpus=True)) is not None
    assert idle_cores_reason(_ranks("g5", 1, cpus=3, gpus=True)) is None


@pytest.mark.parametrize("setting, info, at_start", [
    ("at_start", _ranks("cpu", 2, cpus=2, gpus=False), True),
    ("after_first_step", _ranks("p5", 8, cpus=192, gpus=True), False),
    ("auto", _ranks("p5", 8, cpus=192, gpus=True), True),
    ("auto", _ranks("cpu", 2, cpus=2, gpus=False), False),
])
def test_the_setting_overrides_the_nodes_and_auto_follows_them(setting, info, at_start):
    imports = BackgroundImports(setting)
    assert imports.decide(info) is at_start
    summary = imports.summary()
    assert summary["setting"] == setting
    assert summary["when"] == ("at_start" if at_start else "after_first_step")
    assert summary["reason"]


def test_a_bad_setting_is_refused_naming_it_and_the_choices():
    with pytest.raises(ConfigError) as info:
        rr.ResilienceConfig(background_imports="eager")
    assert info.value.field == "ResilienceConfig.background_imports"
    assert info.value.value == "eager"
    assert "'at_start'" in str(info.value) and "'after_first_step'" in str(info.value)


class _PrestartGroup(DummyWorkerGroup):
    """Records when the supervisor asked for prestarted workers, on the fake clock."""

    def __init__(self, *args: Any, cpus: int, gpus: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prestart_pending = True
        self.prestarted_at: list[float] = []
        for item in self.info:
            item.update(cpus=cpus, gpu_ids=["0"] if gpus else [])

    def prestart(self) -> list[str]:
        self.prestarted_at.append(self.clock.time())
        self.prestart_pending = False
        return ["node-0"]


def _supervisor(setting: str, script: dict, *, cpus: int, gpus: bool) -> tuple[Any, _PrestartGroup]:
    sup, plain, _ = make(script, dataclasses.replace(both_rungs(), background_imports=setting))
    group = _PrestartGroup(plain.clock, script, world_size=2, cpus=cpus, gpus=gpus)
    group.supervisor = sup
    sup._group_factory = group.factory
    return sup, group


@pytest.mark.parametrize("setting, cpus, gpus, at_start", [
    ("auto", 192, True, True), ("auto", 2, False, False),
    ("at_start", 2, False, True), ("after_first_step", 192, True, False),
])
def test_the_supervisor_prestarts_workers_when_it_decided(setting, cpus, gpus, at_start):
    sup, group = _supervisor(setting, {}, cpus=cpus, gpus=gpus)
    outcome = sup.run()
    assert outcome.error is None
    first_step = min(m["time"] for m in outcome.metrics_history)
    (asked,) = group.prestarted_at
    assert (asked < first_step) is at_start
    assert outcome.control["background_imports"]["when"] == (
        "at_start" if at_start else "after_first_step")


def _respawned(setting: str) -> tuple[Any, _PrestartGroup, float]:
    """A run whose rank 1 dies at step 2 and is respawned: the outcome, the group and the
    recovered attempt's first step's time. The respawn leaves a node to prestart again, as
    `WorkerGroup.replace` does."""
    script = {(0, 1): Act("die", steps=2), (0, 0): Act("hang", steps=2)}
    sup, group = _supervisor(setting, script, cpus=2, gpus=False)
    replace = group.replace

    def replace_and_pend(*args: Any, **kwargs: Any) -> Any:
        group.prestart_pending = True
        return replace(*args, **kwargs)

    group.replace = replace_and_pend
    outcome = sup.run()
    assert outcome.error is None and len(outcome.faults) == 1
    recovered = min(m["time"] for m in outcome.metrics_history if m["attempt"] == 1)
    return outcome, group, recovered


def test_a_rank_respawned_on_a_node_with_idle_cores_gets_its_worker_at_once():
    # "at_start" does not wait for the recovered attempt's first step.
    outcome, group, recovered = _respawned("at_start")
    assert len(group.prestarted_at) == 2 and group.prestarted_at[1] < recovered
    asked = outcome.control["background_imports"]["prestarts"]
    assert [(p["attempt"], p["nodes"]) for p in asked] == [(0, 1), (1, 1)]
    assert [p["t"] for p in asked] == group.prestarted_at


def test_a_rank_respawned_on_a_busy_node_gets_its_worker_once_the_recovery_stepped():
    # On a node the ranks keep busy, the next worker's boot (at the ranks' priority) and import
    # would share the cores with the respawned rank's start, its load and its first step.
    outcome, group, recovered = _respawned("after_first_step")
    assert len(group.prestarted_at) == 2 and group.prestarted_at[1] >= recovered
    asked = outcome.control["background_imports"]["prestarts"]
    assert [p["attempt"] for p in asked] == [0, 1]
