"""Hugging Face `transformers.LlamaForCausalLM` for the example job: Llama configs built from their
values (no download), FSDP2 per decoder layer, meta-device init, bf16 mixed precision on GPU and
optional activation checkpointing (transformers is a dependency of the package).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

EXTRA_HINT = "pip install transformers (a dependency of ray_resilience)"

LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
"""Llama 3.1's rotary scaling, as in its published config.json."""

PRESETS: dict[str, dict[str, Any]] = {
    # Meta's Llama-3.1-8B config.json, by value: 8.0 B parameters.
    "llama3.1-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                        max_position_embeddings=131072, rms_norm_eps=1e-5,
                        rope_parameters=LLAMA3_ROPE),
    # The same family (GQA, SwiGLU, Llama 3 rope) at CPU-test size: 0.2 M parameters.
    "llama3-tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=172,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=131072, rms_norm_eps=1e-5,
                        rope_parameters=LLAMA3_ROPE),
}
"""LlamaConfig values per preset; `--hidden_width` and friends override single values."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelOptions:
    """How the model is sharded and run on each rank."""

    bf16: bool = False
    """bf16 parameters in forward/backward, fp32 master weights and gradient reduction."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward instead of keeping them."""
    seed: int = 0
    """Initial weights (same on every rank for a given world size)."""
    initializer_range: float = 0.02
    """Standard deviation of the initial weights (norm weights start at 1)."""


def require_transformers() -> Any:
    """The transformers module, or an ImportError that says what to install."""
    try:
        import transformers  # noqa: PLC0415 - only the HF example models need it
    except ModuleNotFoundError as err:
        raise ImportError(f"the Hugging Face Llama models need transformers ({err}): "
                          f"{EXTRA_HINT}") from None
    return transformers


def llama_config(preset: str, **overrides: Any) -> Any:
    """A `transformers.LlamaConfig` from a preset's values and the non-None `overrides`."""
    transformers = require_transformers()
    values = {**PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None}}
    return transformers.LlamaConfig(**values, hidden_act="silu", tie_word_embeddings=False,
                                    use_cache=False, attention_dropout=0.0)


def build_model(config: Any, options: ModelOptions, device: torch.device) -> torch.nn.Module:
    """An FSDP2-sharded `LlamaForCausalLM`: built on the meta device (no full copy in memory),
    one `fully_shard` per decoder layer plus the root, then each rank's shards materialized on
    `device` and initialized. `load_checkpoint` may overwrite them right after."""
    transformers = require_transformers()
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    if options.activation_checkpointing:
        _checkpoint_activations(model)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if options.bf16 else MixedPrecisionPolicy()
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    model.to_empty(device=device)
    init_weights(model, options)
    return model


@torch.no_grad()
def init_weights(model: torch.nn.Module, options: ModelOptions) -> None:
    """Normal(0, initializer_range) weights and unit norms, drawn through DTensor's sharded RNG
    under `options.seed`; the rotary tables `to_empty` left uninitialized are recomputed."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(options.seed)
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, options.initializer_range)
    rotary = model.model.rotary_emb
    fresh = type(rotary)(model.config)  # a few KB of buffers, computed on the CPU
    for name, buffer in fresh.named_buffers():
        getattr(rotary, name).copy_(buffer)


def causal_lm_loss(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token loss over rows of seq_len + 1 tokens (transformers shifts the labels)."""
    return model(input_ids=tokens, labels=tokens).loss


def num_parameters(config: Any) -> int:
    """Parameters of the full model for `config`, counted on the meta device."""
    transformers = require_transformers()
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    return sum(p.numel() for p in model.parameters())


def _checkpoint_activations(model: Any) -> None:
    """Non-reentrant recompute per decoder layer (transformers renamed the method in 5.x)."""
    kwargs = {"use_reentrant": False}
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
