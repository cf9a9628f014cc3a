"""CheckpointConfig validation, save rounds and owner assignment (no Ray)."""

from __future__ import annotations

import pytest

from ray_resilience._internal.checkpoint.service.rounds import RoundTable, assign_owners
from ray_resilience.checkpoint import CheckpointConfig
from ray_resilience.errors import ConfigError

pytestmark = pytest.mark.timeout(30)


def test_defaults_are_valid_and_off():
    config = CheckpointConfig()
    assert config.interval_steps == 0 and config.in_flight_policy == "coalesce"
    assert config.num_to_keep == 2 and config.memory_tier and config.writers_per_node == 1
    assert not config.is_save_step(0) and not config.is_save_step(10)


def test_is_save_step_follows_interval():
    config = CheckpointConfig(interval_steps=5)
    assert [s for s in range(1, 16) if config.is_save_step(s)] == [5, 10, 15]


@pytest.mark.parametrize("field, value, words", [
    ("interval_steps", -1, "interval_steps"),
    ("interval_steps", 2.5, "integer"),
    ("in_flight_policy", "queue", "coalesce"),
    ("num_to_keep", 1, "at least 2"),
    ("writers_per_node", 0, "writers_per_node"),
    ("memory_budget_bytes", -5, "memory_budget_bytes"),
    ("num_storage_retries", -1, "num_storage_retries"),
    ("storage_retry_backoff_s", 0, "seconds"),
    ("write_timeout_s", -1.0, "seconds"),
    ("warn_interval_s", 5000.0, "write_timeout_s"),
    ("memory_replicas", -1, "memory_replicas"),
    ("writer_priority", "high", "background"),
])
def test_invalid_values_name_field_value_and_fix(field, value, words):
    with pytest.raises(ValueError) as info:
        CheckpointConfig(**{field: value})
    assert isinstance(info.value, ConfigError)
    message = str(info.value)
    assert f"CheckpointConfig.{field}" in message and repr(value) in message and words in message


def test_auto_writer_priority_is_background_unless_training_waits_for_the_writer():
    assert CheckpointConfig().writer_priority_now == "background"
    assert CheckpointConfig(in_flight_policy="skip").writer_priority_now == "background"
    assert CheckpointConfig(in_flight_policy="block").writer_priority_now == "inherit"
    low = CheckpointConfig(in_flight_policy="block", writer_priority="low")
    assert low.writer_priority_now == "low"


def test_replicas_need_the_memory_tier():
    with pytest.raises(ConfigError) as info:
        CheckpointConfig(memory_replicas=1, memory_tier=False)
    assert "CheckpointConfig.memory_replicas" in str(info.value)
    assert "memory_tier=True" in str(info.value)
    assert CheckpointConfig(memory_replicas=1).memory_replicas == 1


KEYS = {0: [("model.w|(0,)", 8), ("optimizer.lr|()", 0)],
        1: [("model.w|(4,)", 8), ("optimizer.lr|()", 0)]}


def table(world_size: int = 2) -> RoundTable:
    rounds = RoundTable()
    rounds.begin("s1", world_size)
    return rounds


def test_round_is_claimed_only_when_every_rank_is_ready_and_dedups_replicated_items():
    rounds = table()
    rounds.vote("s1", 5, 0, ready=True, plan_id="p0", keys=KEYS[0])
    assert rounds.result("s1", 5, 0) is None and rounds.waiting_for("s1", 5) == [1]
    rounds.vote("s1", 5, 1, ready=True, plan_id="p1", keys=KEYS[1])
    r0, r1 = rounds.result("s1", 5, 0), rounds.result("s1", 5, 1)
    assert r0.claimed and r1.claimed
    assert r0.owned[0] and r1.owned[0]  # each rank writes its own shard
    assert r0.owned[1] != r1.owned[1]  # exactly one writes the replicated setting


def test_round_with_a_rank_not_ready_is_not_claimed_and_names_it():
    rounds = table(3)
    for rank, ready in ((0, True), (1, False), (2, True)):
        rounds.vote("s1", 5, rank, ready=ready, plan_id="p", keys=[("x|()", 4)])
    result = rounds.result("s1", 5, 2)
    assert not result.claimed and result.reason == "not ready: ranks [1]" and result.owned is None


def test_a_vote_for_a_later_step_closes_earlier_rounds_the_voter_never_joined():
    rounds = table()
    rounds.vote("s1", 5, 0, ready=True, plan_id="p0", keys=KEYS[0])
    rounds.vote("s1", 6, 1, ready=True, plan_id="p1", keys=KEYS[1])  # rank 1 never saved step 5
    result = rounds.result("s1", 5, 0)
    # Rank 1 passed step 5 over and reports why itself: rank 0 learns who, and stays quiet.
    assert not result.claimed and result.reason == "not ready: ranks [1]"
    assert result.not_ready == (1,)


def test_a_round_opened_after_a_rank_passed_it_over_is_not_claimed():
    rounds = table()
    rounds.vote("s1", 9, 1, ready=False, plan_id="p1", keys=KEYS[1])  # gave up 4..9 in one call
    rounds.vote("s1", 5, 0, ready=True, plan_id="p0", keys=KEYS[0])
    result = rounds.result("s1", 5, 0)
    assert not result.claimed and result.not_ready == (1,)
    rounds.vote("s1", 10, 0, ready=True, plan_id="p0", keys=None)
    rounds.vote("s1", 10, 1, ready=True, plan_id="p1", keys=None)
    assert rounds.result("s1", 10, 1).claimed  # the next round both join is claimed


def test_a_new_session_ends_the_old_rounds_and_ignores_their_votes():
    rounds = table()
    rounds.vote("s1", 5, 0, ready=True, plan_id="p0", keys=KEYS[0])
    rounds.begin("s2", 2)
    assert rounds.result("s1", 5, 0).reason == "session ended"
    rounds.vote("s1", 5, 1, ready=True, plan_id="p1", keys=KEYS[1])
    assert rounds.open_rounds() == {}


def test_plans_travel_once_and_an_unknown_plan_is_not_claimed():
    rounds = table()
    for rank in (0, 1):
        rounds.vote("s1", 5, rank, ready=True, plan_id=f"p{rank}", keys=KEYS[rank])
    for rank in (0, 1):  # same plans: no keys sent again
        rounds.vote("s1", 6, rank, ready=True, plan_id=f"p{rank}", keys=None)
    assert rounds.result("s1", 6, 1).claimed
    for rank in (0, 1):
        rounds.vote("s1", 7, rank, ready=True, plan_id="never-sent", keys=None)
    assert rounds.result("s1", 7, 0).reason == "plan unknown"


def test_withdrawn_round_ends_unclaimed():
    rounds = table()
    rounds.vote("s1", 5, 0, ready=True, plan_id="p0", keys=KEYS[0])
    rounds.withdraw("s1", 5, 0, "timed out")
    rounds.vote("s1", 5, 1, ready=True, plan_id="p1", keys=KEYS[1])
    result = rounds.result("s1", 5, 1)
    assert not result.claimed and "rank 0 gave up: timed out" in result.reason


@pytest.mark.parametrize("value", ["async", "", None])
def test_snapshot_mode_is_checked(value):
    with pytest.raises(ConfigError) as info:
        CheckpointConfig(snapshot=value)
    assert "CheckpointConfig.snapshot" in str(info.value) and "'sync'" in str(info.value)


def test_auto_snapshot_copies_small_states_in_sync_and_overlaps_large_ones():
    auto = CheckpointConfig()
    assert auto.snapshot == "auto" and auto.auto_sync_max_bytes == 128 * 2**10
    assert not auto.overlaps_copy(64 * 2**10, has_optimizer=True)
    assert auto.overlaps_copy(128 * 2**10, has_optimizer=True)
    assert not auto.overlaps_copy(2**30, has_optimizer=False)  # nothing holds the writes
    assert CheckpointConfig(snapshot="overlap").overlaps_copy(1, has_optimizer=True)
    assert not CheckpointConfig(snapshot="sync").overlaps_copy(2**30, has_optimizer=True)
    assert CheckpointConfig(auto_sync_max_bytes=0).overlaps_copy(1, has_optimizer=True)
    with pytest.raises(ConfigError, match="CheckpointConfig.auto_sync_max_bytes"):
        CheckpointConfig(auto_sync_max_bytes=-1)


def test_assign_owners_keeps_sharded_items_and_dedups_replicated_ones():
    rank0 = [("model.w|(0, 0)", 400), ("optimizer.step|()", 8), ("optimizer.lr|()", 0)]
    rank1 = [("model.w|(4, 0)", 400), ("optimizer.step|()", 8), ("optimizer.lr|()", 0)]
    owned = assign_owners([rank0, rank1])
    assert owned[0][0] and owned[1][0]  # each rank writes its own shard
    for i in (1, 2):  # each replicated item is written by exactly one rank
        assert owned[0][i] != owned[1][i]
    assert owned == assign_owners([rank0, rank1])  # deterministic


def test_assign_owners_balances_replicated_bytes():
    keys = [[(f"t{i}|()", 100) for i in range(10)] for _ in range(2)]
    owned = assign_owners(keys)
    assert sum(owned[0]) == 5 and sum(owned[1]) == 5
