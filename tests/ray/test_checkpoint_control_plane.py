"""The checkpoint control plane's own faults, and nothing lost silently: the commit coordinator
SIGKILLed mid-run (restarted, the run ends bit-equal, every save committed or accounted for); a
save dropped because a tensor changed after `report` is listed in the Result with a warning; a
step that does not load is quarantined, and a later restore follows the resumed timeline."""

from __future__ import annotations

import logging
import os
import time

import pytest

import ray_resilience as rr
from ray_resilience._internal.checkpoint.format.commit import committed_steps
from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage
from ray_resilience._internal.constants import TEST_COPY_DELAY_ENV_VAR
from ray_resilience.checkpoint import CheckpointConfig
from ray_resilience.testing import Fault, FaultPlan
from tests.support import workload
from tests.support.checkpoint_harness import on_all, start_with, stop_ranks
from tests.support.checkpoint_service import start_service, step_folder, wait_committed

pytestmark = pytest.mark.timeout(400)


@pytest.mark.slow  # ~30 s
def test_a_killed_coordinator_restarts_and_the_run_loses_no_commit(clean_run, token_data_dir,
                                                                    tmp_path):
    """SIGKILL of the coordinator at step 5, then a rank's exception at step 9 whose restart
    loads through the restarted coordinator."""
    clean = clean_run(2, 12)
    marker = str(tmp_path / "killed")
    resilience = rr.ResilienceConfig(
        in_process=rr.InProcessConfig(), first_step_timeout_s=120.0,
        checkpoint=CheckpointConfig(interval_steps=2, num_to_keep=10),
        fault_plan=FaultPlan.explicit([Fault(step=9, rank=1, kind="exception")]))
    result = workload.fit(token_data_dir, str(tmp_path), "coordinator", max_steps=12,
                          resilience=resilience, kill_coordinator_at_step=5, marker=marker)
    assert result.ok, result.error
    for rank in range(2):
        workload.assert_bit_equal(result.return_values[rank]["state"],
                                  clean.return_values[rank]["state"])
    killed = result.return_values[0]["killed_coordinator"]
    stats = result.checkpoint["stats"]
    assert killed is not None and stats["pid"] != killed  # a new coordinator process finished
    committed = {d.step for d in committed_steps(CheckpointStorage.for_run(str(tmp_path),
                                                                           "coordinator"))}
    dropped = {d["step"]: d for d in result.checkpoint["dropped"]}
    assert result.checkpoint["latest_committed_step"] == 12 and 12 in committed
    assert set(range(2, 13, 2)) <= committed | set(dropped), (committed, dropped)
    # What the faults may cost: the saves before the exception at step 9 that were not committed
    # when the coordinator died at step 5 or were asked for while it restarted (the restart of
    # a coordinator takes seconds, steps take a fraction of one), which the new attempt after
    # the exception gives up; and any save a busy machine coalesced into the next one. Every
    # other save commits, the last one included.
    lost = {step: d for step, d in dropped.items() if step not in committed}
    assert all(step < 9 or d["kind"] == "coalesced" for step, d in lost.items()), lost
    assert all(d["kind"] in ("restart", "not_committed", "coalesced") for d in lost.values()), lost


def test_a_save_dropped_after_report_is_listed_and_warned_about(clean_run, token_data_dir,
                                                                tmp_path, monkeypatch, caplog):
    """The run's last save is torn (its tensors written in place before the copy ran): the run
    ends "ok", but the Result says which save is missing and why, and the driver warns."""
    clean = clean_run(2, 12)
    monkeypatch.setenv(TEST_COPY_DELAY_ENV_VAR, "0.5")  # the write surely lands before the copy
    resilience = rr.ResilienceConfig.disabled(
        checkpoint=CheckpointConfig(interval_steps=2, snapshot="overlap"))
    with caplog.at_level(logging.WARNING, logger="ray_resilience.trainer"):
        result = workload.fit(token_data_dir, str(tmp_path), "torn", max_steps=12,
                              resilience=resilience, touch_after_step=12)
    assert result.ok, result.error
    workload.assert_bit_equal(result.return_values[0]["state"], clean.return_values[0]["state"])
    assert result.checkpoint["latest_committed_step"] == 10
    dropped = result.checkpoint["dropped"]
    torn = [d for d in dropped if d["kind"] == "torn"]
    assert sorted((d["step"], d["rank"]) for d in torn) == [(12, 0), (12, 1)], dropped
    assert all("changed while" in d["reason"] for d in torn)
    # A busy machine may also coalesce an early save into the next one (the writers import DCP
    # only after the first step, so the first save can still be in flight): listed as such.
    others = [d for d in dropped if d["kind"] != "torn"]
    assert all(d["kind"] == "coalesced" and d["step"] < 10 and "replaced by the save of step"
               in d["reason"] for d in others), dropped
    assert result.checkpoint["dropped_total"] == len(dropped)
    # The rank actors' snapshots went to their writers through shared memory, adopted there.
    writers = result.checkpoint["stats"]["writers"]
    assert sum(w["adopted"] for w in writers) >= 2, writers
    assert not any(w["pulled"] for w in writers), writers
    assert not any(w["filled"] or w["copied"] or w["unmapped"] for w in writers), writers
    warning = [r.getMessage() for r in caplog.records if "not committed" in r.getMessage()]
    assert len(warning) == 1 and "step 12" in warning[0] and "torn" in warning[0]


@pytest.mark.slow  # ~20 s
def test_a_step_that_does_not_load_is_quarantined_and_the_resumed_timeline_wins(ray_session,
                                                                                 tmp_path):
    root = str(tmp_path)
    service, ranks = start_with(lambda: start_service(root, 2, memory_tier=False,
                                                      num_to_keep=3))
    try:
        for step in (2, 4, 6):
            on_all(ranks, "save", step)
            assert all(on_all(ranks, "wait_idle"))
            wait_committed(service, step)
        shard = os.path.join(step_folder(root, "run", 6), "__1_0.distcp")
        with open(shard, "rb") as f:
            good = f.read()
        with open(shard, "r+b") as f:
            f.seek(len(good) // 2)
            f.write(b"\xff" * 64)  # damaged: its CRC no longer matches
        loaded = on_all(ranks, "load")
        assert [r["step"] for r in loaded] == [4, 4]
        assert "the manifest says" in loaded[0]["fallbacks"][0]
        stats = service.stats()
        assert list(stats["quarantined"]) == [os.path.basename(step_folder(root, "run", 6))]
        assert service.latest_committed_step() == 4
        loaded = on_all(ranks, "load")  # not tried again
        assert [(r["step"], r["fallbacks"]) for r in loaded] == [(4, [])] * 2
        on_all(ranks, "save", 5)  # the resumed attempt's first commit
        assert all(on_all(ranks, "wait_idle"))
        wait_committed(service, 5)
        expected = on_all(ranks, "full_state")[0]
    finally:
        stop_ranks(ranks)
        service.shutdown()
    with open(shard, "wb") as f:
        f.write(good)  # step 6 would load again: it is still the abandoned timeline's
    service, ranks = start_with(lambda: start_service(root, 2, memory_tier=False,
                                                      num_to_keep=3))
    try:
        assert [r["step"] for r in on_all(ranks, "load")] == [5, 5]
        workload.assert_bit_equal(on_all(ranks, "full_state")[0], expected)
    finally:
        stop_ranks(ranks)
        service.shutdown()


def test_a_backlog_of_given_up_saves_costs_one_vote_and_every_drop_is_reported(ray_session,
                                                                                tmp_path):
    """Saves asked for faster than they are copied: each rank holds two snapshots being copied
    and gives the next ones up at once. Its rounds thread passes over the given-up rounds and
    votes "not ready" once, in the newest; the coordinator counts that vote as "not ready" in
    every round the rank passed over, and each rank reports each save it gave up itself."""
    service, ranks = start_with(
        lambda: start_service(str(tmp_path), 2, in_flight_policy="coalesce",
                              snapshot="overlap", memory_tier=False),
        copy_delay_s=2.0)  # each background copy ends 2 s late: saves 3..8 find no slot
    try:
        for step in range(1, 9):
            on_all(ranks, "save", step)
        assert all(on_all(ranks, "wait_idle"))
        deadline = time.monotonic() + 60
        while (stats := service.stats())["pending_steps"] and time.monotonic() < deadline:
            time.sleep(0.1)  # the newest durable step is being committed
        # Per rank: step 1, step 2 (claimed, or given up once step 1 was being written) and
        # step 8, which says "not ready" for 3..7 too: 3 votes, not 8.
        assert stats["counts"]["votes"] == 6, stats
        dropped = {(d["step"], d["rank"]): d["kind"] for d in stats["dropped"]}
        for step in range(3, 9):
            assert dropped.get((step, 0)) == dropped.get((step, 1)) == "skipped", dropped
        committed = set(stats["committed_steps"])
        # Step 2 is committed, or given up by a rank (each decides from its own state: one may
        # withdraw it for a newer save while the other still waits), and reported by that rank.
        assert 1 in committed, (committed, dropped)
        assert (2 in committed) != any(s == 2 for s, _ in dropped), (committed, dropped)
        assert not any(kind == "not_committed" for kind in dropped.values()), dropped
        on_all(ranks, "save", 9)  # the rounds after the backlog are claimed as before
        assert all(on_all(ranks, "wait_idle"))
        wait_committed(service, 9)
    finally:
        stop_ranks(ranks)
        service.shutdown()
