"""`report()` without a step counts calls per rank (from the restored step after a load); a
checkpoint passed on a step the interval does not save is said once; the context's Ray Train
getters. Driven on a session in this process: no Ray, no process group."""

from __future__ import annotations

import logging

import pytest
import torch

import ray_resilience as rr
from ray_resilience.checkpoint import CheckpointConfig
from ray_resilience.context import TrainContext, _Session, _set_session

pytestmark = pytest.mark.timeout(30)


class _Checkpointer:
    """What `report` and `load_checkpoint` use of a `RankCheckpointer`."""

    def __init__(self, config: CheckpointConfig, restore_step: int | None = None) -> None:
        self.config, self.restore_step, self.saved = config, restore_step, []

    def maybe_save(self, step, *, model, optimizer, extra):
        if self.config.is_save_step(step):
            self.saved.append(step)
        return None

    def take_local_blocking(self):
        return []

    def take_events(self):
        return []

    def load(self, *, model, optimizer):
        if self.restore_step is None:
            return None
        return rr.checkpoint.LoadedCheckpoint(step=self.restore_step, extra={}, tier="local",
                                             path="/dev/shm/x")


def _context(rank: int = 0) -> TrainContext:
    return TrainContext(world_rank=rank, world_size=4, local_rank=rank % 2, local_world_size=2,
                        node_rank=rank // 2, attempt=0, device=torch.device("cpu"),
                        run_name="r", run_dir="/tmp/r")


@pytest.fixture
def session():
    def install(checkpointer=None) -> _Session:
        current = _Session(_context(), checkpointer=checkpointer)
        _set_session(current)
        return current

    yield install
    _set_session(None)


def _steps(session: _Session) -> list[int]:
    return [record["step"] for record in session.pending]


def test_steps_are_counted_per_call_when_omitted(session):
    current = session()
    for _ in range(3):
        rr.report({"loss": 1.0})
    rr.report({"loss": 1.0}, step=10)  # an explicit step resets the count
    rr.report({"loss": 1.0})
    assert _steps(current) == [1, 2, 3, 10, 11]


def test_counting_resumes_after_the_restored_step(session):
    model = torch.nn.Linear(2, 2)
    current = session(_Checkpointer(CheckpointConfig(interval_steps=2), restore_step=6))
    loaded = rr.load_checkpoint(model=model)
    assert loaded.step == 6 and current.step is None  # a load is no step of this attempt
    rr.report({"loss": 1.0}, checkpoint=rr.CheckpointState(model))
    rr.report({"loss": 1.0}, checkpoint=rr.CheckpointState(model))
    assert _steps(current) == [7, 8] and current.checkpointer.saved == [8]


def test_a_checkpoint_on_a_step_the_interval_skips_is_said_once(session, caplog):
    from ray_resilience import context  # noqa: PLC0415 - its once-per-process memory

    context._said.clear()
    model = torch.nn.Linear(2, 2)
    session(_Checkpointer(CheckpointConfig(interval_steps=5)))
    with caplog.at_level(logging.WARNING, logger="ray_resilience.context"):
        for _ in range(6):
            rr.report({}, checkpoint=rr.CheckpointState(model))
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "CheckpointConfig.interval_steps=5" in said[0]
    assert "step 1 " in said[0] and "at the interval its measured cost allows" in said[0]


def test_a_checkpoint_with_checkpointing_off_is_said_once(session, caplog):
    from ray_resilience import context  # noqa: PLC0415 - its once-per-process memory

    context._said.clear()
    session(None)
    with caplog.at_level(logging.WARNING, logger="ray_resilience.context"):
        for step in (1, 2):
            rr.report({}, step=step, checkpoint=rr.CheckpointState(torch.nn.Linear(2, 2)))
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "ResilienceConfig.checkpoint=None" in said[0]


def test_context_has_ray_trains_getters():
    ctx = _context(rank=3)
    assert (ctx.get_world_rank(), ctx.get_world_size(), ctx.get_local_rank()) == (3, 4, 1)
    assert (ctx.get_local_world_size(), ctx.get_node_rank()) == (2, 1)
