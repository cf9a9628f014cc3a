"""End to end through `ResilientTrainer`: a second `fit()` with the same run name resumes from the
last committed checkpoint and ends bit-equal to an uninterrupted run."""

from __future__ import annotations

import os

import pytest
import torch
from torch.distributed.fsdp import fully_shard

import ray_resilience as rr
from ray_resilience.checkpoint import CheckpointConfig
from ray_resilience.checkpoint.commit import committed_steps
from ray_resilience.checkpoint.storage import CheckpointStorage
from ray_resilience.examples.llama import build_model, causal_lm_loss
from ray_resilience.examples.token_data import TokenDataset

pytestmark = pytest.mark.timeout(400)
INTERVAL = 3


def train_loop(cfg: dict) -> dict:
    ctx = rr.get_context()
    torch.manual_seed(ctx.world_rank)
    model = build_model("tiny", seed=0)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = TokenDataset(cfg["data_dir"])
    loaded = rr.load_checkpoint(model=model, optimizer=optimizer)
    start = 0
    if loaded is not None:
        start = loaded.extra["data_step"]
        torch.set_rng_state(loaded.extra["rng"])
    for step in range(start + 1, cfg["max_steps"] + 1):
        inputs, targets = data.batch(step - 1, ctx.world_rank, ctx.world_size, 4)
        noise = torch.rand(()).item()  # RNG use that a resume must replay exactly
        loss = causal_lm_loss(model(inputs), targets) * (1.0 + 1e-3 * noise)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        extra = {"data_step": step, "rng": torch.get_rng_state()}
        rr.report({"loss": loss.item()}, step=step, checkpoint=rr.CheckpointState(model, optimizer, extra))
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}
    return {"state": full, "resumed_from": loaded.step if loaded else None,
            "tier": loaded.tier if loaded else None}


def fit(data_dir: str, storage: str, name: str, max_steps: int) -> rr.Result:
    resilience = rr.ResilienceConfig.disabled(checkpoint=CheckpointConfig(interval_steps=INTERVAL))
    return rr.ResilientTrainer(
        train_loop, train_loop_config={"data_dir": data_dir, "max_steps": max_steps},
        scaling_config=rr.ScalingConfig(num_workers=2),
        run_config=rr.RunConfig(name=name, storage_path=storage, verbose=False),
        resilience=resilience).fit()


def test_second_fit_resumes_from_last_commit_and_matches_uninterrupted(ray_session, token_data_dir, tmp_path):
    store = str(tmp_path)
    clean = fit(token_data_dir, store, "uninterrupted", max_steps=12)
    assert clean.ok, clean.error
    first = fit(token_data_dir, store, "resumed", max_steps=8)
    assert first.ok, first.error
    assert all(v["resumed_from"] is None for v in first.return_values)
    storage = CheckpointStorage.for_run(store, "resumed")
    last = committed_steps(storage)[0].step
    assert last in (6, 3) and last % INTERVAL == 0  # step 8 is not a save step
    second = fit(token_data_dir, store, "resumed", max_steps=12)
    assert second.ok, second.error
    assert [v["resumed_from"] for v in second.return_values] == [last, last]
    assert [v["tier"] for v in second.return_values] == ["storage", "storage"]
    for rank in range(2):
        got, want = second.return_values[rank]["state"], clean.return_values[rank]["state"]
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in got), f"rank {rank} differs"
    assert os.path.isdir(os.path.join(store, "resumed", "checkpoints"))
