"""CheckpointConfig validation and the in-flight admission rule (no Ray)."""

from __future__ import annotations

import pytest

from ray_resilience.checkpoint import CheckpointConfig
from ray_resilience.checkpoint.agreement import admit, assign_owners
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
])
def test_invalid_values_name_field_value_and_fix(field, value, words):
    with pytest.raises(ValueError) as info:
        CheckpointConfig(**{field: value})
    assert isinstance(info.value, ConfigError)
    message = str(info.value)
    assert f"CheckpointConfig.{field}" in message and repr(value) in message and words in message


@pytest.mark.parametrize("pending, busy, expected", [
    (0, 0, "stage"), (0, 2, "stage"), (2, 2, "replace"), (1, 2, "skip")])
def test_coalesce_replaces_only_when_every_rank_still_has_it_pending(pending, busy, expected):
    assert admit("coalesce", pending_ranks=pending, busy_ranks=busy, world_size=2) == expected


@pytest.mark.parametrize("busy, expected", [(0, "stage"), (1, "skip"), (2, "skip")])
def test_skip_stages_only_when_no_rank_is_busy(busy, expected):
    assert admit("skip", pending_ranks=0, busy_ranks=busy, world_size=2) == expected


def test_block_always_stages_after_its_wait():
    assert admit("block", pending_ranks=0, busy_ranks=0, world_size=3) == "stage"


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
