"""Preemption notices: which ranks move, the step every rank stops at, and the deadline."""

from __future__ import annotations

import time

from ray_resilience._internal.preemption import (
    DEFAULT_GRACE_S,
    PreemptionWatch,
    stop_step,
)


class Group:
    """Two nodes of two ranks each; `draining` is what the GCS would say."""

    world_size = 4

    def __init__(self, draining: dict[str, float]) -> None:
        self.draining = draining

    def node_of_rank(self, rank: int) -> str:
        return "a" if rank < 2 else "b"

    def draining_nodes(self) -> dict[str, float]:
        return self.draining


def test_the_stop_step_leaves_time_for_every_rank_to_hear_of_it():
    assert stop_step(10, None) == 12  # unknown pace: two steps ahead
    assert stop_step(10, 2.0) == 12  # slow steps: the notice arrives within the next one
    assert stop_step(10, 0.1) == 21  # fast steps: one second of them, plus one


def test_a_draining_node_moves_its_ranks_by_its_deadline():
    deadline = time.time() + 90
    watch = PreemptionWatch()
    notice = watch.check(Group({"b": deadline}), attempt=3, newest_step=7, step_time_s=None)
    assert (notice.nodes, notice.ranks, notice.step, notice.attempt) == (("b",), (2, 3), 9, 3)
    assert notice.deadline == deadline
    assert watch.check(Group({"b": deadline}), 3, 8, None) is None  # one notice at a time


def test_a_ranks_sigterm_moves_that_rank_with_the_default_grace():
    watch = PreemptionWatch()
    assert watch.check(Group({}), 0, 4, None) is None
    watch.rank_terminated(1)
    notice = watch.check(Group({}), 0, 4, None)
    assert notice.ranks == (1,) and notice.nodes == ()
    assert abs(notice.deadline - (notice.t_notice + DEFAULT_GRACE_S)) < 1e-6


def test_the_repair_takes_the_notice_once_the_ranks_stopped():
    class Outcome:
        def __init__(self, rank: int, status: str) -> None:
            self.rank, self.status = rank, status

    watch = PreemptionWatch()
    watch.rank_terminated(0)
    watch.check(Group({}), 0, 1, None)
    watch.note_outcomes([Outcome(0, "preempted"), Outcome(1, "finished")])
    assert watch.stopped == {0}
    assert watch.take().ranks == (0,) and watch.notice is None
    assert watch.check(Group({}), 1, 5, None) is None  # the SIGTERM was handled
