"""Command-line arguments of the example job. Where the AWS awsome-distributed-training FSDP test
case has an argument for the same thing, its name is accepted too (`--train_batch_size`,
`--checkpoint_freq`, `--checkpoint_dir`, `--model_type`, `--hidden_width`, ...).
"""

from __future__ import annotations

import argparse
import os

from ray_resilience.examples import hf_llama

TOY_MODEL = "tiny"
"""Our own dependency-free LLaMA (ray_resilience/examples/llama.py): no transformers needed."""
MODEL_TYPES = {"llama_v3": "llama3.1-8b", "llama_v2": "llama3.1-8b"}
"""AWS `--model_type` values: the Llama architecture, shaped by --hidden_width and friends."""
SHAPE_ARGS = {"hidden_width": "hidden_size", "num_layers": "num_hidden_layers",
              "num_heads": "num_attention_heads", "num_key_value_heads": "num_key_value_heads",
              "intermediate_size": "intermediate_size", "vocab_size": "vocab_size"}
"""AWS shape arguments -> the LlamaConfig fields they override."""



def _interval(text: str) -> int | str:
    return text if text == "auto" else int(text)

def _int_flag(text: str) -> bool:
    """The AWS test case writes switches as integers (`--bf16 1`)."""
    if text not in ("0", "1"):
        raise argparse.ArgumentTypeError(f"expected 0 or 1, got {text!r}")
    return text == "1"


def parser(description: str = "") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ray-resilience train", description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    _model_args(p.add_argument_group("model"))
    _training_args(p.add_argument_group("training"))
    _checkpoint_args(p.add_argument_group("checkpoints and resilience"))
    _cluster_args(p.add_argument_group("cluster"))
    return p


def _model_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--model", default=None, choices=sorted([*hf_llama.PRESETS, TOY_MODEL]),
                   help="Hugging Face Llama config preset (transformers; default "
                        f"llama3-tiny), or {TOY_MODEL!r}: our own small LLaMA, which needs "
                        "nothing else")
    g.add_argument("--model_type", choices=sorted(MODEL_TYPES),
                   help="AWS name: a Llama shaped by the arguments below (from the 8B preset "
                        "unless --model names another)")
    for flag in SHAPE_ARGS:
        g.add_argument(f"--{flag}", type=int, help="overrides the preset's value")
    g.add_argument("--max_context_width", type=int, default=None,
                   help="tokens per training sequence of the generated data (default: 64)")
    g.add_argument("--initializer_range", type=float, default=0.02)
    g.add_argument("--bf16", type=_int_flag, default=True,
                   help="1: bf16 mixed precision (GPU only; fp32 on CPU)")
    g.add_argument("--activation_checkpointing", type=_int_flag, default=True,
                   help="1: recompute each decoder layer in backward")


def _training_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--max_steps", "--max_training_steps", type=int, default=100)
    g.add_argument("--batch_size", "--train_batch_size", type=int, default=4,
                   help="sequences per rank per step")
    g.add_argument("--lr", type=float, default=3e-3)
    g.add_argument("--weight_decay", type=float, default=0.0)
    g.add_argument("--beta1", type=float, default=0.9)
    g.add_argument("--beta2", type=float, default=0.95)
    g.add_argument("--grad_clip", type=float, default=0.0, help="max gradient norm (0: off)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--data", "--data_dir", dest="data", default=None,
                   help="tokenized Parquet files (a folder or URI: local, FSx, s3://) with a "
                        "'tokens' column of seq_len + 1 ids (default: a small set generated "
                        "on the driver)")


def _checkpoint_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--checkpoint_interval", "--checkpoint_freq", type=int, default=10,
                   help="steps between committed checkpoints; 0 disables")
    g.add_argument("--memory_replicas", type=int, default=0,
                   help="other writers (other nodes first) that also keep each rank's newest "
                        "checkpoint in memory, so ranks of a lost node restore without storage")
    g.add_argument("--local_interval_steps", type=_interval, default="auto",
                   help="also snapshot each rank into node-local /dev/shm every N steps, so a "
                        "restart on the same node redoes at most N steps (0: off; 'auto': the "
                        "shortest interval costing at most 1%% of step time)")
    g.add_argument("--local_max_bytes", type=int, default=None,
                   help="ranks whose state is larger skip the local snapshots (bytes; default: "
                        "only the tmpfs capacity check)")
    g.add_argument("--storage_path", "--checkpoint_dir", dest="storage_path",
                   default=os.path.abspath("runs"))
    g.add_argument("--run_name", default="llama-fsdp")
    g.add_argument("--fault_count", type=int, default=0)
    g.add_argument("--fault_seed", type=int, default=42)
    g.add_argument("--fault_after_step", type=int, default=10)
    g.add_argument("--fault_kinds", default="exception", help="comma-separated FaultKind values")


def _cluster_args(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--num_workers", type=int, default=2)
    g.add_argument("--use_gpu", action="store_true")
    g.add_argument("--address", default=None,
                   help="Ray cluster to join (default: $RAY_ADDRESS, as under `ray job "
                        "submit`; without either, a new local Ray)")
    g.add_argument("--quiet", action="store_true", help="no live progress display")


def parse_args(argv: list[str] | None = None, *, description: str = "") -> argparse.Namespace:
    p = parser(description)
    args = p.parse_args(argv)
    if args.model_type is not None and args.model == TOY_MODEL:
        p.error(f"--model_type shapes a Hugging Face Llama; not with --model {TOY_MODEL}")
    if args.model is None:
        args.model = MODEL_TYPES[args.model_type] if args.model_type else "llama3-tiny"
    if args.model == TOY_MODEL and any(getattr(args, f) is not None for f in SHAPE_ARGS):
        p.error(f"--model {TOY_MODEL} has fixed shapes; the shape arguments need a Llama preset")
    if args.max_steps < 1 or args.batch_size < 1:
        p.error("--max_steps and --batch_size must be >= 1")
    return args


def config_overrides(args: argparse.Namespace) -> dict[str, int | float | None]:
    """LlamaConfig values the command line sets (None: the preset's)."""
    overrides: dict[str, int | float | None] = {
        field: getattr(args, flag) for flag, field in SHAPE_ARGS.items()}
    overrides["initializer_range"] = args.initializer_range
    return overrides
