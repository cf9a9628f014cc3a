"""`ray_train_fsdp.py` ported to ray_resilience: the same driver and configs, a resilient trainer
(docs/ray_train_port.md shows the diff).

    python jobs/ray_train_port/resilient_fsdp.py --storage_path /tmp/ray_train_port
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator

import numpy as np
import ray.data
import torch
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from torch.distributed.fsdp import fully_shard

import ray_resilience as rr

WIDTH = 64
BATCH = 16


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank
    model = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH),
                                                      torch.nn.Tanh()) for _ in range(4)))
    for layer in model:
        fully_shard(layer)
    return fully_shard(model)


def make_dataset(num_rows: int) -> ray.data.Dataset:
    """Rows of WIDTH inputs (column "data"), the same on every run."""
    inputs = np.random.default_rng(0).standard_normal((num_rows, WIDTH), dtype=np.float32)
    return ray.data.from_numpy(inputs)


def epochs(shard) -> Iterator[dict[str, torch.Tensor]]:
    """This rank's batches of the dataset, epoch after epoch."""
    while True:
        yield from shard.iter_torch_batches(batch_size=BATCH)


def train_loop(config: dict) -> None:
    rank = rr.get_context().get_world_rank()
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    start = 0
    checkpoint = rr.load_checkpoint(model=model, optimizer=optimizer)
    if checkpoint:
        start = checkpoint.step
    batches = epochs(rr.get_dataset_shard("train"))
    for step in range(start + 1, config["steps"] + 1):
        inputs = next(batches)["data"]
        targets = torch.sin(inputs.flip(-1))
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step == config["fail_at_step"] and rank == 0 and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()  # fails once, as a transient error does
            raise RuntimeError(f"transient failure at step {step}")
        rr.report({"loss": loss.item()}, checkpoint=rr.CheckpointState(model, optimizer))
    final = {k: v.full_tensor() for k, v in model.state_dict().items()}
    if rank == 0:
        torch.save(final, config["final_weights"])


def main(argv: list[str] | None = None) -> rr.Result:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--storage_path", required=True)
    parser.add_argument("--name", default="fsdp-port")
    parser.add_argument("--num_workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--fail_at_step", type=int, default=None)
    args = parser.parse_args(argv)
    trainer = rr.ResilientTrainer(
        train_loop,
        train_loop_config={"steps": args.steps, "fail_at_step": args.fail_at_step,
                           "marker": os.path.join(args.storage_path, "failed-once"),
                           "final_weights": os.path.join(args.storage_path, "final.pt")},
        datasets={"train": make_dataset(args.num_workers * BATCH * 8)},
        scaling_config=ScalingConfig(num_workers=args.num_workers),
        run_config=RunConfig(name=args.name, storage_path=args.storage_path,
                             failure_config=FailureConfig(max_failures=3),
                             checkpoint_config=CheckpointConfig(num_to_keep=2)),
    )
    return trainer.fit()


if __name__ == "__main__":
    print(main().metrics)
