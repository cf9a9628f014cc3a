"""The local tier off the training thread: snapshots staged and copied while the next step
runs, written by the pipeline's local writer (`local/writer.py`), at an interval chosen from
measured costs (`local/schedule.py`).

One process, no Ray: a plain model and AdamW, one rank (its agreement is local).
"""

from __future__ import annotations

import math

import pytest
import torch

from ray_resilience._internal.checkpoint.format.extra_codec import snapshot_extra
from ray_resilience._internal.checkpoint.rank.agreement import Agreement
from ray_resilience._internal.checkpoint.rank.handoff import HandoffPipeline
from ray_resilience._internal.checkpoint.rank.local import schedule as local_schedule
from ray_resilience._internal.checkpoint.rank.local.schedule import LocalSchedule
from ray_resilience._internal.checkpoint.rank.local.tier import LocalSnapshots, layout_digest
from ray_resilience._internal.checkpoint.rank.slots import LocalWrite, RankSaveStats
from ray_resilience._internal.checkpoint.rank.state_cache import StateCache
from ray_resilience._internal.checkpoint.rank.writer_link import WriterLink
from ray_resilience.checkpoint import CheckpointConfig
from ray_resilience.errors import ConfigError
from tests.support.local_snapshots import _equal, _restore, _state, _step, _trained

pytestmark = pytest.mark.timeout(60)
ONE_RANK = Agreement(rank=0, world_size=1, timeout_s=10.0)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _probe(schedule: LocalSchedule, clock: _Clock, *, step_s: float, cost_s: float,
           steps: int, write_wall_s: float = 0.0, slot_wait_s: float = 0.0) -> list[int]:
    """Runs `steps` steps of `step_s` each; every local write costs `cost_s` (blocking) besides
    `slot_wait_s` waiting for the previous write's slot, and holds its slot for
    `write_wall_s`."""
    written = []
    for step in range(1, steps + 1):
        clock.now += step_s
        local = schedule.is_local_step(step)
        if local:
            written.append(step)
            schedule.record_blocking(step, cost_s, slot_wait_s=slot_wait_s)
            schedule.record_write(step, 0.0, wall_s=write_wall_s)
        schedule.after_step(step, agreement=ONE_RANK, wait_idle=lambda: True)
    return written


def test_auto_probes_then_picks_the_shortest_interval_within_the_budget(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(local_schedule.time, "perf_counter", clock)
    schedule = LocalSchedule(CheckpointConfig(local_overhead_budget=0.01), rank=0)
    assert schedule.interval is None
    written = _probe(schedule, clock, step_s=0.5, cost_s=0.12, steps=40)
    want = math.ceil(0.12 / (0.01 * 0.5))  # 24 steps
    assert schedule.interval == want
    assert written == [1, 3, 8, 32]  # the probe's three writes, then every 24th step
    event, = schedule.take_events()
    assert (event["interval_steps"], event["mode"], event["decided_at_step"]) == (want, "auto", 8)
    assert event["cost_s"] == pytest.approx(0.12) and event["step_s"] == pytest.approx(0.5)


def test_a_cheap_write_is_taken_every_step(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(local_schedule.time, "perf_counter", clock)
    schedule = LocalSchedule(CheckpointConfig(), rank=0)
    _probe(schedule, clock, step_s=1.0, cost_s=0.001, steps=10)
    assert schedule.interval == 1


def test_on_a_gpu_rank_the_interval_is_never_shorter_than_a_write(monkeypatch):
    """On a GPU rank the background write costs training nothing, so the budget alone would
    take a 2 GB state every few steps; but a write holds its slot until done (seen on an H200:
    0.1 s steps, writes of ~0.5 s, interval 5). The interval covers the write's wall time."""
    clock = _Clock()
    monkeypatch.setattr(local_schedule.time, "perf_counter", clock)
    schedule = LocalSchedule(CheckpointConfig(), rank=0)
    schedule.on_cpu = False
    # The probe's writes come 2 steps apart: each waits for the previous one's slot. That wait
    # is not a write's cost (counted, it took the interval to 270-334 steps on the H200).
    _probe(schedule, clock, step_s=0.1, cost_s=0.0035, steps=12, write_wall_s=0.55,
           slot_wait_s=0.3)
    assert math.ceil(0.0035 / (0.01 * 0.1)) == 4  # what the budget alone allows
    assert schedule.interval == 6
    event, = schedule.take_events()
    assert event["write_wall_s"] == pytest.approx(0.55)
    assert event["slot_wait_s"] == pytest.approx(0.3)
    on_cpu = LocalSchedule(CheckpointConfig(), rank=0)  # a CPU rank: the budget decides
    _probe(on_cpu, clock, step_s=0.1, cost_s=0.0035, steps=12, write_wall_s=0.05)
    assert on_cpu.interval == 4


def test_a_new_attempt_reuses_what_was_measured_and_a_fixed_interval_is_kept(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(local_schedule.time, "perf_counter", clock)
    schedule = LocalSchedule(CheckpointConfig(), rank=0)
    _probe(schedule, clock, step_s=0.2, cost_s=0.01, steps=10)
    schedule.take_events()
    schedule.begin_attempt(ONE_RANK, resumed=9)
    assert schedule.interval == 5 and schedule.take_events()[0]["decided_at_step"] == 9
    assert [s for s in range(9, 20) if schedule.is_local_step(s)] == [14, 19]
    fresh = LocalSchedule(CheckpointConfig(), rank=0)
    fresh.begin_attempt(ONE_RANK, resumed=9)  # nothing measured (a respawned process)
    assert fresh.interval is None
    assert [s for s in range(10, 18) if fresh.is_local_step(s)] == [10, 12, 17]
    fixed = LocalSchedule(CheckpointConfig(local_interval_steps=3), rank=0)
    fixed.begin_attempt(ONE_RANK, resumed=None)
    assert fixed.interval == 3 and [s for s in range(1, 10) if fixed.is_local_step(s)] == [3, 6, 9]


def test_no_room_turns_the_tier_off_at_the_decision(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(local_schedule.time, "perf_counter", clock)
    schedule = LocalSchedule(CheckpointConfig(), rank=0)
    schedule.turn_off("two 1.00 GB files ... do not fit")
    written = _probe(schedule, clock, step_s=0.1, cost_s=0.0, steps=12)
    assert written == [] and schedule.interval == 0
    assert schedule.take_events()[0]["off"].startswith("two 1.00 GB files")


@pytest.mark.parametrize(("field", "value"), [("local_interval_steps", "sometimes"),
                                              ("local_overhead_budget", 0),
                                              ("local_overhead_budget", 1.5),
                                              ("replica_bytes_per_s", -1)])
def test_bad_tier_settings_name_the_setting(field, value):
    with pytest.raises(ConfigError, match=f"CheckpointConfig.{field}"):
        CheckpointConfig(**{field: value})
    assert CheckpointConfig().local_interval_steps == "auto"


def test_an_overlapped_local_snapshot_holds_the_next_optimizer_step_until_copied(tmp_path):
    """The training thread stages and returns; the copy (delayed here) runs while the next
    step's forward and backward would, `optimizer.step` waits for it, the file is written in
    the background, and what it holds is the state of the staged step, bit for bit."""
    model, optimizer = _trained()
    config = CheckpointConfig(snapshot="overlap")
    store = LocalSnapshots(str(tmp_path), 0)
    schedule = LocalSchedule(config, rank=0)
    pipeline = HandoffPipeline(rank=0, world_size=1, config=config,
                               link=WriterLink(rank=0, writer=None, writer_id="", coordinator=None),
                               stats=RankSaveStats(), copy_delay_s=1.0, local=store,
                               schedule=schedule)
    try:
        pipeline.begin_session("s")
        cache = StateCache()
        _step(model, optimizer, 5)
        expected = _state(model, optimizer)
        source = cache.source(model, optimizer, lambda n: True)
        pipeline.copier.guard(optimizer)
        target = LocalWrite("s", 1, layout_digest(source.items))
        assert pipeline.stage(1, source, snapshot_extra({"step": 1}), copy_all_now=False,
                              save=False, local=target)
        _step(model, optimizer, 6)  # its optimizer.step waits for the copy
        assert pipeline.wait_local_idle(30)
        assert not _equal(_state(model, optimizer), expected)
        assert schedule.cost_s() is not None
    finally:
        pipeline.close()
    fresh_model, fresh_opt = _trained(seed=4)
    loaded = _restore(LocalSnapshots(str(tmp_path), 0), fresh_model, fresh_opt)
    assert (loaded.step, loaded.extra["step"]) == (1, 1)
    assert _equal(_state(fresh_model, fresh_opt), expected)
    assert not torch.equal(next(fresh_model.parameters()), next(model.parameters()))


def test_a_local_step_waits_for_the_previous_local_write_and_says_how_long(tmp_path):
    """Local-tier-only snapshots hold one slot at a time (the other two are the saves'): a local
    step staged while the previous one is still copying waits for it, and the pipeline reports
    that wait apart from the write's own cost; both steps end up on file. On CPU each one's slot
    is laid over the file it goes to: no staging memory."""
    model, optimizer = _trained()
    config = CheckpointConfig(snapshot="overlap")
    store = LocalSnapshots(str(tmp_path), 0)
    pipeline = HandoffPipeline(rank=0, world_size=1, config=config,
                               link=WriterLink(rank=0, writer=None, writer_id="", coordinator=None),
                               stats=RankSaveStats(), copy_delay_s=0.5, local=store,
                               schedule=LocalSchedule(config, rank=0))
    cache = StateCache()
    try:
        pipeline.begin_session("s")
        for step in (1, 2):
            source = cache.source(model, optimizer, lambda n: True)
            assert pipeline.stage(step, source, snapshot_extra({"step": step}),
                                  copy_all_now=False, save=False,
                                  local=LocalWrite("s", step, layout_digest(source.items)))
            if step == 1:
                assert pipeline.take_slot_wait_s() == 0.0
        assert pipeline.take_slot_wait_s() > 0.0  # step 2 waited for step 1's slot
        assert pipeline.stats.counts["local_slot_waits"] >= 1
        assert sorted(s.direct for s in pipeline.pool.slots) == [0, 1]
        assert pipeline.pool.staging_bytes == 0
        assert pipeline.wait_local_idle(30)
    finally:
        pipeline.close()
    fresh_model, fresh_opt = _trained(seed=4)
    assert _restore(LocalSnapshots(str(tmp_path), 0), fresh_model, fresh_opt).step == 2
