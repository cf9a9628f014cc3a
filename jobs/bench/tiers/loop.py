"""The train function of the tier benchmark: the harness's LLaMA sizes, FSDP2 over 2 gloo
ranks, written against the public API as a user would (`load_checkpoint` once, `report` with
the state every step, the RNG state in `extra`)."""

from __future__ import annotations

from typing import Any

import torch
from harness.sizes import size

import ray_resilience as rr
from ray_resilience.examples.llama import build_sharded, causal_lm_loss, load_or_init
from ray_resilience.examples.token_data import TokenDataset


def train_loop(config: dict[str, Any]) -> dict[str, Any]:
    torch.set_num_threads(1)  # 2 ranks on 2 cores, as every benchmark here
    shape = size(config["size"])
    ctx = rr.get_context()
    # Only this rank's shards, allocated on the meta device's plan and filled by the load: a
    # restart never initializes the whole model on the CPU first.
    model = build_sharded(shape.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loaded = load_or_init(model, optimizer, seed=0)
    start = 0 if loaded is None else loaded.step
    torch.manual_seed(1000 + ctx.world_rank)
    if loaded is not None:
        torch.set_rng_state(loaded.extra["rng"])
    data = TokenDataset(config["data_dir"])
    for step in range(start + 1, config["steps"] + 1):
        inputs, targets = data.batch(step - 1, ctx.world_rank, ctx.world_size, shape.batch_size)
        inputs, targets = inputs[:, :shape.seq_len], targets[:, :shape.seq_len]
        loss = causal_lm_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        rr.report({"loss": loss.item()}, step=step, checkpoint=rr.CheckpointState(
            model, optimizer, extra={"rng": torch.get_rng_state()}))
    return {"resumed_from": start}
