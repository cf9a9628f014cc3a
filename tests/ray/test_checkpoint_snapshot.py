"""The snapshot is exact although the copy overlaps training, and saving needs no collective.

Real FSDP2 ranks on gloo, real writers. The background copy of each save is held back
(`copy_delay_s`), so the optimizer step right after `save` returns really does race it: only
the optimizer-step guard keeps the checkpoint exact, and a direct in-place write is detected.
"""

from __future__ import annotations

import time

import pytest
import ray

from tests.support.checkpoint_harness import on_all, start_with, stop_ranks
from tests.support.checkpoint_service import (
    assert_same,
    start_service,
    wait_committed,
    wait_dropped,
)

pytestmark = pytest.mark.timeout(300)
DELAY_S = 0.6


@pytest.fixture
def ranks_with_slow_copy(ray_session, tmp_path, request):
    # "overlap" explicitly (the default "auto" also overlaps the tiny model's 0.75 MB per rank).
    config = {"snapshot": "overlap", **getattr(request, "param", {})}
    service, ranks = start_with(lambda: start_service(str(tmp_path), 2, **config),
                                copy_delay_s=DELAY_S)
    on_all(ranks, "train", 2, save=False)
    yield service, ranks
    stop_ranks(ranks)
    service.shutdown()


def test_optimizer_step_right_after_save_waits_for_the_copy(ranks_with_slow_copy):
    service, ranks = ranks_with_slow_copy
    expected = on_all(ranks, "save_then_mutate", 3, "optimizer")[0]
    assert all(on_all(ranks, "wait_idle"))
    wait_committed(service, 3)
    stats = on_all(ranks, "stats")
    # The copy started DELAY_S late, so the step could only have been held by the guard.
    assert all(max(s["guard_wait_s"]) > DELAY_S * 0.5 for s in stats), \
        [s["guard_wait_s"] for s in stats]
    assert [s.get("torn", 0) for s in stats] == [0, 0] and service.stats()["dropped"] == []
    loaded = on_all(ranks, "load")
    assert [r["step"] for r in loaded] == [3, 3]
    assert_same(expected, on_all(ranks, "full_state")[0])


def test_in_place_write_during_the_copy_drops_the_save_and_keeps_the_last_commit(
        ranks_with_slow_copy):
    service, ranks = ranks_with_slow_copy
    on_all(ranks, "save", 2)
    assert all(on_all(ranks, "wait_idle"))
    wait_committed(service, 2)
    before = on_all(ranks, "full_state")[0]
    on_all(ranks, "save_then_mutate", 3, "inplace")  # no optimizer step: nothing holds the write
    assert all(on_all(ranks, "wait_idle"))
    stats = on_all(ranks, "stats")
    assert all(s["torn"] == 1 for s in stats), stats
    dropped = wait_dropped(service, 3)  # its round ended unclaimed: it can never commit
    assert {d["kind"] for d in dropped} == {"torn"} and "changed while" in dropped[0]["reason"]
    assert service.stats()["committed_steps"] == [2]  # never a torn step 3
    assert [r["step"] for r in on_all(ranks, "load")] == [2, 2]
    assert_same(before, on_all(ranks, "full_state")[0])


# "auto" with the tiny model's state (~0.75 MB per rank) below auto_sync_max_bytes: sync.
@pytest.mark.parametrize("ranks_with_slow_copy",
                         [{"snapshot": "sync"},
                          # ~8 s; "auto" resolving to sync is unit-tested (test_checkpoint_config)
                          pytest.param({"snapshot": "auto", "auto_sync_max_bytes": 8 * 2**20},
                                       marks=pytest.mark.slow)],
                         indirect=True)
def test_sync_snapshot_is_exact_even_under_in_place_writes(ranks_with_slow_copy):
    service, ranks = ranks_with_slow_copy
    expected = on_all(ranks, "save_then_mutate", 3, "inplace")[0]
    assert all(on_all(ranks, "wait_idle"))
    wait_committed(service, 3)
    assert [(s.get("torn", 0), s["guard_wait_s"]) for s in on_all(ranks, "stats")] == [(0, [])] * 2
    on_all(ranks, "load")
    assert_same(expected, on_all(ranks, "full_state")[0])


def test_replaced_storage_drops_that_save_and_the_next_one_is_exact(ranks_with_slow_copy):
    """The plan's tensors are checked for replaced storage where they are copied (after `save`
    returns): a save that would copy a tensor training no longer updates is dropped, and the
    next one rebuilds its plan and holds the values at save time."""
    service, ranks = ranks_with_slow_copy
    on_all(ranks, "save", 2)  # builds the plan
    assert all(on_all(ranks, "wait_idle"))
    wait_committed(service, 2)
    on_all(ranks, "replace_storage")
    on_all(ranks, "train", 1, save=False)  # the optimizer updates the new storage only
    on_all(ranks, "save", 3)
    assert all(on_all(ranks, "wait_idle"))
    assert all(s["torn"] == 1 for s in on_all(ranks, "stats"))
    assert {d["kind"] for d in wait_dropped(service, 3)} == {"torn"}
    assert service.stats()["committed_steps"] == [2]  # never step 3 with the stale moments
    on_all(ranks, "train", 1, save=False)
    expected = on_all(ranks, "save_then_mutate", 5, "optimizer")[0]
    assert all(on_all(ranks, "wait_idle"))
    wait_committed(service, 5)
    assert [r["step"] for r in on_all(ranks, "load")] == [5, 5]
    assert_same(expected, on_all(ranks, "full_state")[0])


def test_later_saves_reuse_the_plan_but_see_new_settings(ranks_with_slow_copy):
    service, ranks = ranks_with_slow_copy
    on_all(ranks, "save", 3)
    on_all(ranks, "set_lr", 0.00123)  # e.g. a learning-rate schedule between two saves
    on_all(ranks, "train", 1, save=False)
    on_all(ranks, "save", 4)
    assert all(on_all(ranks, "wait_idle"))
    wait_committed(service, 4)
    on_all(ranks, "set_lr", 0.5)
    assert [r["step"] for r in on_all(ranks, "load")] == [4, 4]
    assert on_all(ranks, "lr") == [0.00123, 0.00123]
    capture = [s["phases_s"]["capture"] for s in on_all(ranks, "stats")]
    assert all(c[1] < c[0] for c in capture), capture  # the second save took the cached path


def test_save_returns_without_the_other_rank_and_commits_once_it_saves(ranks_with_slow_copy):
    service, ranks = ranks_with_slow_copy
    on_all(ranks, "save", 2)  # the session starts with a collective, once
    assert all(on_all(ranks, "wait_idle"))
    wait_committed(service, 2)
    # Rank 1 is idle: a save that needed a collective would hang here.
    assert ray.get(ranks[0].save.remote(3), timeout=20) is not None
    wait_until(lambda: service.stats()["open_rounds"] == {3: [0]}, "rank 0's vote")
    assert service.latest_committed_step() == 2  # the round waits for rank 1: no commit yet
    assert ray.get(ranks[1].save.remote(3), timeout=20) is not None
    assert all(on_all(ranks, "wait_idle"))
    wait_committed(service, 3)


def test_the_coordinators_long_poll_is_held_until_a_commit(ranks_with_slow_copy):
    service, ranks = ranks_with_slow_copy
    on_all(ranks, "save", 2)
    assert all(on_all(ranks, "wait_idle"))
    wait_committed(service, 2)
    now = service.poll(0)
    seen = (now["incarnation"], 2)
    held = service.long_poll(now["cursor"], seen, 120)
    ready, _ = ray.wait([held], timeout=2)
    assert not ready, ray.get(held)  # nothing new: the poll waits (for up to 120 s)
    on_all(ranks, "save", 3)
    assert all(on_all(ranks, "wait_idle"))
    answer = ray.get(held, timeout=60)
    assert (answer["incarnation"], answer["latest"]) == (now["incarnation"], 3)
    assert answer["dropped"] == [] and answer["fenced"] is None
    # A caller that has not seen the commit is answered at once.
    assert ray.get(service.long_poll(now["cursor"], seen, 120), timeout=30)["latest"] == 3
    # At the end of a run the supervisor has every held poll answered before it stops the
    # coordinator (a call cut by the kill would be logged as failed).
    held = service.long_poll(answer["cursor"], (now["incarnation"], 3), 120)
    assert not ray.wait([held], timeout=1)[0]
    service.release_polls()
    assert ray.get(held, timeout=30)["latest"] == 3


def wait_until(predicate, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
