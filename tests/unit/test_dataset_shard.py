"""`DatasetShard` on a stand-in for a materialized Ray Dataset: which rows each rank gets, how
the position moves, and where a resume (at the same or another world size) continues."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ray_resilience._internal.data.shard import DatasetShard, DatasetSource, Position


class FakeMaterialized:
    """The calls `DatasetShard` makes on a MaterializedDataset, over rows 0..n-1."""

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows

    def split_at_indices(self, indices: list[int]):
        (i,) = indices
        return FakeMaterialized(self.rows[:i]), FakeMaterialized(self.rows[i:])

    def iter_batches(self, *, batch_size: int, drop_last: bool, batch_format: str = "numpy",
                     **_):
        assert drop_last
        for start in range(0, len(self.rows) - batch_size + 1, batch_size):
            yield {"idx": self.rows[start:start + batch_size]}

    def iter_torch_batches(self, *, batch_size: int, drop_last: bool, device: str, **_):
        for batch in self.iter_batches(batch_size=batch_size, drop_last=drop_last):
            yield {k: torch.as_tensor(v) for k, v in batch.items()}


@pytest.fixture(autouse=True)
def _slice_in_process(monkeypatch):
    """The fake has no Ray blocks: resuming slices it directly."""
    from ray_resilience._internal.data import suffix  # noqa: PLC0415 - imports Ray Data

    monkeypatch.setattr(suffix, "rows_from", lambda ds, row: ds.split_at_indices([row])[1])


def shard(rank: int, world_size: int, num_rows: int = 20) -> DatasetShard:
    source = DatasetSource(dataset=FakeMaterialized(np.arange(num_rows)), num_rows=num_rows)
    return DatasetShard("train", source, rank=rank, world_size=world_size)


def test_each_rank_takes_its_slice_of_every_global_batch_and_the_tail_is_dropped():
    got = {r: [b["idx"].tolist() for b in shard(r, 2).iter_batches(batch_size=3)]
           for r in range(2)}
    assert got == {0: [[0, 1, 2], [6, 7, 8], [12, 13, 14]],
                   1: [[3, 4, 5], [9, 10, 11], [15, 16, 17]]}  # rows 18, 19 fill no batch


def test_the_position_counts_global_rows_and_rolls_over_at_the_epoch_end():
    s = shard(0, 2)
    batches = s.iter_torch_batches(batch_size=3)
    next(batches)
    assert s.position == Position(epoch=0, row=6)
    next(batches), next(batches)
    assert s.position == Position(epoch=0, row=18)
    assert list(batches) == [] and s.position == Position(epoch=1, row=0)
    assert [b["idx"].tolist() for b in s.iter_torch_batches(batch_size=3)][0] == [0, 1, 2]


def test_a_restored_position_continues_with_the_next_batch_of_that_epoch():
    first = shard(1, 2)
    it = first.iter_batches(batch_size=2)
    next(it), next(it)
    saved = first.position.to_dict()
    resumed = shard(1, 2)
    resumed.restore(saved)
    assert resumed.epoch == 0
    assert [b["idx"].tolist() for b in resumed.iter_batches(batch_size=2)] == \
        [b["idx"].tolist() for b in it]


def test_another_world_size_continues_at_the_first_row_no_rank_read():
    two = shard(0, 2)
    next(two.iter_batches(batch_size=2))  # rows 0-3 read by ranks 0 and 1
    one = shard(0, 1)
    one.restore(two.position.to_dict())
    assert next(one.iter_batches(batch_size=2))["idx"].tolist() == [4, 5]


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"batch_size": 0}, "batch_size"),
    ({"batch_size": 11}, "fewer than one global batch"),
    ({"batch_size": 2, "drop_last": False}, "drop_last"),
    ({"batch_size": 2, "local_shuffle_buffer_size": 8}, "random_shuffle"),
])
def test_settings_that_cannot_resume_exactly_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        shard(0, 2).iter_batches(**kwargs)
