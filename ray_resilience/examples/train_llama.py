"""Train a Hugging Face Llama (transformers.LlamaForCausalLM) with FSDP2 on Ray, surviving faults.

Local (a new local Ray; CPU, gloo, 2 workers, a small tokenized set generated here):

    ray-resilience train --max_steps 100

Any Ray cluster (joins $RAY_ADDRESS, which `ray job submit` sets):

    ray job submit --address http://<head>:8265 -- \\
        ray-resilience train --model llama3.1-8b --num_workers 16 --use_gpu \\
            --data /fsx/data/tokens --storage_path /fsx/checkpoints --run_name llama3-8b-ft

The data is tokenized Parquet read with Ray Data: each rank takes its slice of every global
batch, and the position is saved with each checkpoint. Resubmitting with the same --run_name
resumes from the run's last committed checkpoint at the batch after it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from typing import Any

import ray
import torch

import ray_resilience as rr
from ray_resilience.examples import hf_llama
from ray_resilience.examples.job_args import TOY_MODEL, config_overrides, parse_args
from ray_resilience.testing import FaultPlan

TOY_SEQ_LEN = 64
"""Tokens per generated sequence unless --max_context_width says otherwise."""


def train_loop(cfg: dict[str, Any]) -> dict[str, Any]:
    """Runs on every rank. Re-entered from the newest checkpoint after each restart."""
    ctx = rr.get_context()
    model = _build_model(cfg, ctx.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"], betas=cfg["betas"],
                                  weight_decay=cfg["weight_decay"])
    loaded = rr.load_checkpoint(model=model, optimizer=optimizer)  # data position included
    start = loaded.step if loaded is not None else 0
    batches = endless_batches(rr.get_dataset_shard("train"), cfg["batch_size"])
    for step in range(start + 1, cfg["max_steps"] + 1):
        tokens = next(batches)["tokens"].to(ctx.device)
        loss = _loss(model, tokens, toy=cfg["model"] == TOY_MODEL)
        loss.backward()
        if cfg["grad_clip"]:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        rr.report({"loss": loss.item()}, step=step,
                  checkpoint=rr.CheckpointState(model, optimizer))
    return {"final_step": cfg["max_steps"], "model": type(model).__name__}


def endless_batches(shard: Any, batch_size: int) -> Iterator[dict[str, torch.Tensor]]:
    """This rank's batches, epoch after epoch, from where the shard's position stands."""
    while True:
        yield from shard.iter_torch_batches(batch_size=batch_size, dtypes=torch.int64)


def _build_model(cfg: dict[str, Any], device: torch.device) -> torch.nn.Module:
    if cfg["model"] == TOY_MODEL:
        from torch.distributed.fsdp import fully_shard  # noqa: PLC0415 - the toy model's path

        from ray_resilience.examples.llama import build_model  # noqa: PLC0415 - see above

        model = build_model(TOY_MODEL, seed=cfg["seed"], device=device)
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        return model
    config = hf_llama.llama_config(cfg["model"], **cfg["overrides"])
    options = hf_llama.ModelOptions(bf16=cfg["bf16"] and device.type == "cuda",
                                    activation_checkpointing=cfg["activation_checkpointing"],
                                    seed=cfg["seed"],
                                    initializer_range=cfg["overrides"]["initializer_range"])
    return hf_llama.build_model(config, options, device)


def _loss(model: torch.nn.Module, tokens: torch.Tensor, *, toy: bool) -> torch.Tensor:
    if toy:
        from ray_resilience.examples.llama import causal_lm_loss  # noqa: PLC0415 - the toy's path

        return causal_lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
    return hf_llama.causal_lm_loss(model, tokens)


def ray_init_kwargs(address: str | None, environ: os._Environ | dict[str, str]) -> dict[str, str]:
    """Which Ray to use: --address, else $RAY_ADDRESS (`ray job submit` sets it), else a new
    local one ("local" never reads the address file a dead local cluster may have left)."""
    if address:
        return {"address": address}
    if environ.get("RAY_ADDRESS"):
        return {}  # ray.init reads it
    return {"address": "local"}


def build_dataset(args: argparse.Namespace, vocab_size: int) -> Any:
    """Ray Data over --data, or over a small tokenized set generated on the driver (put into the
    object store from there, so it works on any cluster)."""
    if args.data:
        return ray.data.read_parquet(args.data)
    from ray_resilience.examples.token_data import generate_shards  # noqa: PLC0415 - local only

    seq_len = args.max_context_width or TOY_SEQ_LEN
    path = os.path.join("/tmp", f"ray_resilience_data_{vocab_size}x{seq_len}")
    import pyarrow.parquet as pq  # noqa: PLC0415 - with generate_shards

    tables = [pq.read_table(p) for p in generate_shards(path, seq_len=seq_len,
                                                        vocab_size=vocab_size)]
    return ray.data.from_arrow(tables)


def build_trainer(args: argparse.Namespace,
                  fault_plan: FaultPlan | None = None) -> rr.ResilientTrainer:
    """The trainer for the parsed arguments (Ray must be initialized: the dataset is built here);
    `fault_plan` replaces the one --fault_count generates."""
    overrides = config_overrides(args)
    if args.model == TOY_MODEL:
        vocab_size = 256
        args.max_context_width = min(args.max_context_width or TOY_SEQ_LEN, TOY_SEQ_LEN)
    else:
        vocab_size = hf_llama.llama_config(args.model, **overrides).vocab_size
    plan = fault_plan
    if plan is None and args.fault_count:
        plan = FaultPlan.generate(
            seed=args.fault_seed, fault_count=args.fault_count, after_step=args.fault_after_step,
            max_steps=args.max_steps, world_size=args.num_workers,
            kinds=args.fault_kinds.split(","))
    checkpoint = rr.CheckpointConfig(
        interval_steps=args.checkpoint_interval, memory_replicas=args.memory_replicas,
        local_interval_steps=args.local_interval_steps, local_max_bytes=args.local_max_bytes,
    ) if args.checkpoint_interval else None
    return rr.ResilientTrainer(
        train_loop,
        train_loop_config={
            "model": args.model, "overrides": overrides, "seed": args.seed, "lr": args.lr,
            "betas": (args.beta1, args.beta2), "weight_decay": args.weight_decay,
            "grad_clip": args.grad_clip, "max_steps": args.max_steps,
            "batch_size": args.batch_size, "bf16": args.bf16,
            "activation_checkpointing": args.activation_checkpointing},
        datasets={"train": build_dataset(args, vocab_size)},
        scaling_config=rr.ScalingConfig(num_workers=args.num_workers, use_gpu=args.use_gpu),
        run_config=rr.RunConfig(name=args.run_name, storage_path=args.storage_path,
                                verbose=not args.quiet),
        resilience=rr.ResilienceConfig.default(checkpoint=checkpoint, fault_plan=plan),
    )


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 when the run finished, 1 when it failed, 2 for a missing extra."""
    args = parse_args(argv, description=__doc__)
    if args.model != TOY_MODEL:
        try:
            hf_llama.require_transformers()
        except ImportError as err:
            print(f"error: --model {args.model}: {err} (or --model {TOY_MODEL}, which needs "
                  "nothing else)", file=sys.stderr)
            return 2
    if not ray.is_initialized():
        ray.init(**ray_init_kwargs(args.address, os.environ))
    result = build_trainer(args).fit(raise_on_failure=False)  # the summary names the error
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
