"""Train a LLaMA-style model with FSDP2 on Ray, surviving faults.

Local (starts its own Ray; CPU, gloo, 2 workers):

    python jobs/train_llama_fsdp.py --max_steps 100

Any Ray cluster:

    ray job submit --address http://<head>:8265 --working-dir . -- \
        python jobs/train_llama_fsdp.py --model llama3-8b --num_workers 16 --use_gpu \
            --storage_path /fsx/checkpoints --run_name llama3-8b-ft --checkpoint_interval 100

Argument names follow the AWS NVRx fault-tolerance test case where they overlap
(--max_steps, --checkpoint_interval, --fault_count, --fault_seed, --fault_after_step).
Resubmitting with the same --run_name resumes from the run's last committed checkpoint.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch.distributed.fsdp import fully_shard

import ray_resilience as rr
from ray_resilience.examples.llama import PRESETS, build_model, causal_lm_loss
from ray_resilience.examples.token_data import TokenDataset, generate_shards
from ray_resilience.testing import FaultPlan


def train_loop(cfg: dict) -> dict:
    """Runs on every rank. Re-entered from the newest checkpoint after each restart."""
    ctx = rr.get_context()
    model = build_model(cfg["model"], seed=cfg["seed"], device=ctx.device)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], weight_decay=0.0)
    data = TokenDataset(cfg["data_dir"])

    # Resume: the data position is the step, so the same batches follow in the same order.
    loaded = rr.load_checkpoint(model=model, optimizer=optimizer)
    start = loaded.step if loaded is not None else 0

    for step in range(start + 1, cfg["max_steps"] + 1):
        inputs, targets = data.batch(step - 1, ctx.world_rank, ctx.world_size, cfg["batch_size"])
        loss = causal_lm_loss(model(inputs.to(ctx.device)), targets.to(ctx.device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        rr.report({"loss": loss.item()}, step=step,
                  checkpoint=rr.CheckpointState(model, optimizer, extra={"data_step": step}))
    return {"final_step": cfg["max_steps"]}


def _interval(text: str) -> int | str:
    return text if text == "auto" else int(text)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", choices=sorted(PRESETS))
    p.add_argument("--num_workers", type=int, default=2)
    p.add_argument("--use_gpu", action="store_true")
    p.add_argument("--max_steps", type=int, default=100)
    p.add_argument("--batch_size", type=int, default=4, help="sequences per rank per step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint_interval", type=int, default=10, help="steps; 0 disables")
    p.add_argument("--memory_replicas", type=int, default=0,
                   help="other writers (other nodes first) that also keep each rank's newest "
                        "checkpoint in memory, so ranks of a lost node restore without storage")
    p.add_argument("--local_interval_steps", type=_interval, default="auto",
                   help="also snapshot each rank into node-local /dev/shm every N steps, so a "
                        "restart on the same node redoes at most N steps (0: off; 'auto': the "
                        "shortest interval costing at most 1%% of step time)")
    p.add_argument("--local_max_bytes", type=int, default=None,
                   help="ranks whose state is larger skip the local snapshots (bytes; default: "
                        "only the tmpfs capacity check)")
    p.add_argument("--storage_path", default=os.path.abspath("runs"))
    p.add_argument("--run_name", default="llama-fsdp")
    p.add_argument("--data_dir", default=None, help="Parquet token shards (generated if missing)")
    p.add_argument("--fault_count", type=int, default=0)
    p.add_argument("--fault_seed", type=int, default=42)
    p.add_argument("--fault_after_step", type=int, default=10)
    p.add_argument("--fault_kinds", default="exception", help="comma-separated FaultKind values")
    p.add_argument("--quiet", action="store_true", help="no live progress display")
    return p.parse_args(argv)


def build_trainer(args: argparse.Namespace) -> rr.ResilientTrainer:
    cfg = PRESETS[args.model]
    data_dir = args.data_dir or os.path.join("/tmp", f"ray_resilience_data_{args.model}")
    generate_shards(data_dir, seq_len=min(cfg.max_seq_len, 64), vocab_size=cfg.vocab_size)
    plan = None
    if args.fault_count:
        plan = FaultPlan.generate(
            seed=args.fault_seed, fault_count=args.fault_count, after_step=args.fault_after_step,
            max_steps=args.max_steps, world_size=args.num_workers,
            kinds=args.fault_kinds.split(","))
    return rr.ResilientTrainer(
        train_loop,
        train_loop_config={"model": args.model, "seed": args.seed, "lr": args.lr,
                           "max_steps": args.max_steps, "batch_size": args.batch_size,
                           "data_dir": data_dir},
        scaling_config=rr.ScalingConfig(num_workers=args.num_workers, use_gpu=args.use_gpu),
        run_config=rr.RunConfig(name=args.run_name, storage_path=args.storage_path,
                                verbose=not args.quiet),
        resilience=rr.ResilienceConfig.default(
            checkpoint=rr.CheckpointConfig(interval_steps=args.checkpoint_interval,
                                           memory_replicas=args.memory_replicas,
                                           local_interval_steps=args.local_interval_steps,
                                           local_max_bytes=args.local_max_bytes)
            if args.checkpoint_interval else None, fault_plan=plan),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = build_trainer(args).fit()
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
