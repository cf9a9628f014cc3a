"""A deterministic token dataset in Parquet shards (a sparse random Markov chain, so the loss
falls), read per rank with pyarrow. The data position is the global batch index.
"""

from __future__ import annotations

import os
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

COLUMN = "tokens"


def generate_shards(
    data_dir: str, *, num_samples: int = 4096, seq_len: int = 64, vocab_size: int = 256,
    num_shards: int = 4, seed: int = 1234, successors: int = 4,
) -> list[str]:
    """Writes `num_shards` Parquet files of `num_samples` rows of seq_len + 1 tokens;
    idempotent, and safe under concurrent callers (written aside, renamed into place)."""
    os.makedirs(data_dir, exist_ok=True)
    paths = [os.path.join(data_dir, f"shard-{i:05d}.parquet") for i in range(num_shards)]
    if all(os.path.exists(p) for p in paths):
        return paths
    rng = np.random.default_rng(seed)
    table = rng.integers(0, vocab_size, size=(vocab_size, successors))
    first = rng.integers(0, vocab_size, size=num_samples)
    choice = rng.integers(0, successors, size=(num_samples, seq_len))
    rows = np.empty((num_samples, seq_len + 1), dtype=np.int32)
    rows[:, 0] = first
    for t in range(seq_len):
        rows[:, t + 1] = table[rows[:, t], choice[:, t]]
    for path, part in zip(paths, np.array_split(rows, num_shards), strict=True):
        flat = pa.array(part.reshape(-1))
        column = pa.FixedSizeListArray.from_arrays(flat, seq_len + 1)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        pq.write_table(pa.table({COLUMN: column}), tmp, row_group_size=256)
        os.replace(tmp, path)
    return paths


class TokenDataset:
    """Random access to the shards: `batch(step, rank, world_size, batch_size)`. Global batch
    `step` holds samples [step * G, (step + 1) * G) mod the size, G = world_size * batch_size."""

    def __init__(self, data_dir: str) -> None:
        self._paths = sorted(
            os.path.join(data_dir, f) for f in os.listdir(data_dir) if f.endswith(".parquet")
        )
        if not self._paths:
            raise FileNotFoundError(f"no .parquet shards in data_dir={data_dir!r}")
        self._files = [pq.ParquetFile(p) for p in self._paths]
        counts = [f.metadata.num_rows for f in self._files]
        self._starts = np.cumsum([0] + counts)
        self._cache: dict[int, np.ndarray] = {}
        self.num_samples = int(self._starts[-1])

    def _shard(self, index: int) -> np.ndarray:
        if index not in self._cache:
            column = self._files[index].read(columns=[COLUMN]).column(COLUMN).combine_chunks()
            width = column.type.list_size
            self._cache[index] = column.flatten().to_numpy().reshape(-1, width)
        return self._cache[index]

    def rows(self, indices: np.ndarray) -> np.ndarray:
        indices = indices % self.num_samples
        shard_of = np.searchsorted(self._starts, indices, side="right") - 1
        return np.stack([self._shard(s)[i - self._starts[s]]
                         for s, i in zip(shard_of, indices, strict=True)])

    def batch(self, step: int, rank: int, world_size: int,
              batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = step * world_size * batch_size + rank * batch_size
        rows = torch.from_numpy(self.rows(np.arange(start, start + batch_size)).astype(np.int64))
        return rows[:, :-1], rows[:, 1:]
