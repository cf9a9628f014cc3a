"""`DatasetShard`: what `ray_resilience.get_dataset_shard(name)` returns on a rank.

The run's dataset is materialized once, in a fixed order (`materialize.py`). Every step reads
one global batch of `world_size x batch_size` rows and each rank keeps its slice (rank r: rows
[r x batch_size, (r + 1) x batch_size) of it), so a rank's batches depend only on the dataset,
the world size and the batch size. The position is the epoch and the global row where the next
global batch starts: it does not depend on the world size, travels in every checkpoint, and a
resume (at any world size) continues with the first row no rank has trained on.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

POSITION_KEY = "ray_resilience.data"
"""Key of the datasets' positions inside a checkpoint's `extra` (removed before users see it)."""
_NOT_RESUMABLE = {
    "local_shuffle_buffer_size": "a local shuffle buffer cannot resume mid-epoch; shuffle the "
                                 "dataset before passing it (ds.random_shuffle(seed=...))",
    "collate_fn": "a rank's batch is a slice of the global batch; collate inside the loop",
}


@dataclasses.dataclass(frozen=True)
class DatasetSource:
    """One materialized dataset as the supervisor hands it to every rank."""

    dataset: Any
    """ray.data.MaterializedDataset: its blocks in a fixed order (owned by the supervisor)."""
    num_rows: int


@dataclasses.dataclass(frozen=True)
class Position:
    """Where the next global batch starts: `row` of epoch `epoch` (0-based)."""

    epoch: int = 0
    row: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "row": self.row}


class DatasetShard:
    """This rank's view of one dataset: iterate it with `iter_batches` / `iter_torch_batches`.

    Each call continues from the shard's position to the end of the current epoch (a whole epoch
    when called after the previous one ended); the rows that do not fill a last global batch are
    dropped, so every rank takes the same number of steps. One iterator at a time.
    """

    def __init__(self, name: str, source: DatasetSource, *, rank: int, world_size: int,
                 device: Any = None) -> None:
        self.name, self._source = name, source
        self.rank, self.world_size, self._device = rank, world_size, device
        self.position = Position()

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to (restored by `load_checkpoint`)."""
        return self.position.epoch

    @property
    def num_rows(self) -> int:
        """Rows in one epoch of the whole dataset (all ranks together)."""
        return self._source.num_rows

    def restore(self, saved: dict[str, int]) -> None:
        self.position = Position(epoch=int(saved["epoch"]), row=int(saved["row"]))

    def iter_batches(self, *, batch_size: int, batch_format: str = "numpy",
                     **kwargs: Any) -> Iterator[Any]:
        """Ray Data's `iter_batches` with `batch_size` rows per rank: dicts of numpy arrays by
        default, or "pandas" / "pyarrow" batches."""
        return self._iterate(batch_size, "iter_batches", batch_format=batch_format, **kwargs)

    def iter_torch_batches(self, *, batch_size: int, device: Any = None,
                           **kwargs: Any) -> Iterator[dict[str, Any]]:
        """Ray Data's `iter_torch_batches` with `batch_size` rows per rank, on `device` (default:
        this rank's device); `dtypes` and `prefetch_batches` pass through."""
        target = device if device is not None else self._device
        batches = self._iterate(batch_size, "iter_torch_batches", device="cpu", **kwargs)
        return ({k: v.to(target) for k, v in b.items()} if target is not None else b
                for b in batches)

    def _iterate(self, batch_size: int, method: str, **kwargs: Any) -> Iterator[Any]:
        _check_kwargs(batch_size, kwargs)
        kwargs.pop("drop_last", None)
        global_rows = batch_size * self.world_size
        if self.num_rows < global_rows:
            raise ValueError(
                f"dataset {self.name!r} has {self.num_rows} rows, fewer than one global batch "
                f"({self.world_size} ranks x batch_size={batch_size}); give more rows or a "
                "smaller batch_size")
        return self._batches(batch_size, global_rows, method, kwargs)

    def _batches(self, batch_size: int, global_rows: int, method: str,
                 kwargs: dict[str, Any]) -> Iterator[Any]:
        epoch, row = self.position.epoch, self.position.row
        rest = self._rest(row)
        if rest is not None:
            lo, hi = self.rank * batch_size, (self.rank + 1) * batch_size
            for batch in getattr(rest, method)(batch_size=global_rows, drop_last=True, **kwargs):
                row += global_rows
                self.position = Position(epoch=epoch, row=row)  # before the user has the batch
                yield _rows(batch, lo, hi)
        self.position = Position(epoch=epoch + 1, row=0)

    def _rest(self, row: int) -> Any:
        """The dataset from global row `row` on (None when nothing is left): no row before it is
        read, and no Ray task runs (see `suffix.py`)."""
        if row <= 0:
            return self._source.dataset
        if row >= self.num_rows:
            return None
        try:
            from ray_resilience._internal.data.suffix import rows_from  # noqa: PLC0415 - Ray Data internals, only on a resume
        except ImportError as err:  # Ray's internals moved: a task slices the first block
            log.warning("resuming dataset %r with a slicing task (%s)", self.name, err)
            return self._source.dataset.split_at_indices([row])[1]
        return rows_from(self._source.dataset, row)

    def __repr__(self) -> str:
        return (f"DatasetShard({self.name!r}, rank={self.rank}/{self.world_size}, "
                f"rows={self.num_rows}, epoch={self.position.epoch}, row={self.position.row})")


def _check_kwargs(batch_size: Any, kwargs: dict[str, Any]) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be an integer >= 1 (rows per rank)")
    if kwargs.get("drop_last") is False:
        raise ValueError("drop_last=False is not supported: every rank must take the same "
                         "number of steps, so rows that do not fill a global batch are dropped")
    for name, why in _NOT_RESUMABLE.items():
        if kwargs.get(name) is not None:
            raise ValueError(f"{name} is not supported by get_dataset_shard: {why}")


def _rows(batch: Any, lo: int, hi: int) -> Any:
    """Rows [lo, hi) of a batch: a dict of arrays/tensors, a pandas DataFrame or an Arrow table."""
    if isinstance(batch, dict):
        return {k: v[lo:hi] for k, v in batch.items()}
    if hasattr(batch, "iloc"):
        return batch.iloc[lo:hi]
    return batch.slice(lo, hi - lo)
