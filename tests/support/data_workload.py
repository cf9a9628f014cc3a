"""A Ray Data workload for the integration tests: the tiny LLaMA fed by `get_dataset_shard`, on a
Parquet dataset whose rows carry their index, so a test can check which rows each step read."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.distributed.fsdp import fully_shard

import ray_resilience as rr
from ray_resilience.examples.llama import build_model, causal_lm_loss
from ray_resilience.examples.token_data import COLUMN, TokenDataset

BATCH_SIZE = 4
NUM_ROWS = 84
"""With 2 ranks x 4 rows: 10 global batches per epoch, and 4 rows that fill none (dropped)."""


def write_dataset(token_dir: str, out: str, *, filesystem=None, num_files: int = 3) -> None:
    """`NUM_ROWS` rows of the example token set in `num_files` Parquet files under `out`, with
    an `idx` column (the row's position in the dataset order)."""
    rows = TokenDataset(token_dir).rows(np.arange(NUM_ROWS))
    parts = np.array_split(np.arange(NUM_ROWS), num_files)
    if filesystem is None:
        os.makedirs(out, exist_ok=True)
    for i, part in enumerate(parts):
        flat = pa.array(rows[part].reshape(-1).astype(np.int32))
        table = pa.table({"idx": pa.array(part, pa.int64()),
                          COLUMN: pa.FixedSizeListArray.from_arrays(flat, rows.shape[1])})
        pq.write_table(table, f"{out}/part-{i:03d}.parquet", filesystem=filesystem,
                       row_group_size=16)


def expected_rows(step: int, rank: int, world_size: int) -> list[int]:
    """Row indices rank `rank` trains on at `step` (1-based) in a run at one world size."""
    per_epoch = NUM_ROWS // (world_size * BATCH_SIZE)
    start = ((step - 1) % per_epoch) * world_size * BATCH_SIZE + rank * BATCH_SIZE
    return list(range(start, start + BATCH_SIZE))


def train_loop(cfg: dict) -> dict:
    """FSDP2 tiny LLaMA on `get_dataset_shard("train")`; returns the final full state and, per
    step this attempt trained, the epoch and the row indices it read."""
    ctx = rr.get_context()
    model = build_model("tiny", seed=0)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    loaded = rr.load_checkpoint(model=model, optimizer=optimizer)
    start = loaded.step if loaded is not None else 0
    shard = rr.get_dataset_shard("train")
    seen = {}

    def batches():
        while True:
            yield from shard.iter_torch_batches(batch_size=BATCH_SIZE)

    stream = batches()
    for step in range(start + 1, cfg["max_steps"] + 1):
        batch = next(stream)
        seen[step] = (shard.epoch, batch["idx"].tolist())
        tokens = batch[COLUMN].long()
        loss = causal_lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        rr.report({"loss": loss.item()}, step=step,
                  checkpoint=rr.CheckpointState(model, optimizer, extra=cfg.get("extra", {})))
    return {"state": {k: v.full_tensor() for k, v in model.state_dict().items()},
            "seen": seen, "attempt": ctx.attempt, "world_size": ctx.world_size,
            "resumed_from": loaded.step if loaded else None,
            "extra": loaded.extra if loaded else None}


def fit(dataset, storage: str, name: str, *, num_workers: int = 2, max_steps: int = 14,
        resilience: rr.ResilienceConfig | None = None, **cfg) -> rr.Result:
    return rr.ResilientTrainer(
        train_loop, train_loop_config={"max_steps": max_steps, **cfg},
        datasets={"train": dataset},
        scaling_config=rr.ScalingConfig(num_workers=num_workers),
        run_config=rr.RunConfig(name=name, storage_path=storage, verbose=False),
        resilience=resilience or rr.ResilienceConfig.disabled(),
    ).fit()
