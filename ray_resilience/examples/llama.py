"""A LLaMA-style decoder: RMSNorm, rotary embeddings, SwiGLU, grouped-query causal attention.
Presets from `tiny` (CPU tests) to `llama3-8b` (Llama-3.1-8B's shapes).

Fast restarts at GB scale: `build_sharded` builds the model on the meta device, shards it with
FSDP2 and allocates only this rank's shards, uninitialized; `load_or_init` then fills them from
the newest checkpoint, or with `build_model`'s initial weights when there is none. A restart
never initializes (nor holds) the full model on the CPU:

    model = build_sharded("llama3-8b", device=ctx.device)
    optimizer = torch.optim.AdamW(model.parameters())
    loaded = load_or_init(model, optimizer, seed=0)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass(frozen=True, kw_only=True)
class LlamaConfig:
    """Model shape. Field names follow the Llama reference implementation."""

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    ffn_dim: int
    max_seq_len: int
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    dropout: float = 0.0
    """Residual dropout after attention and feed-forward (0: none, and no RNG is consumed)."""

    def __post_init__(self) -> None:
        if self.dim % self.n_heads:
            raise ValueError(f"dim={self.dim} must be divisible by n_heads={self.n_heads}.")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads={self.n_heads} must be divisible by n_kv_heads={self.n_kv_heads}."
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout={self.dropout} must be in [0, 1).")


PRESETS: dict[str, LlamaConfig] = {
    "tiny": LlamaConfig(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, ffn_dim=172, max_seq_len=64
    ),
    # ~500 MB of parameters + AdamW state in fp32: the checkpoint benchmark's "large" state.
    "small": LlamaConfig(
        dim=512, n_layers=8, n_heads=8, n_kv_heads=4, vocab_size=8192, ffn_dim=1376,
        max_seq_len=256,
    ),
    "llama3-8b": LlamaConfig(
        dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab_size=128256, ffn_dim=14336,
        max_seq_len=8192,
    ),
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rotary_tables(head_dim: int, seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables of shape (seq_len, head_dim // 2)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates pairs of channels of x (batch, seq, heads, head_dim) by position-dependent angles."""
    x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = cfg.n_heads, cfg.n_kv_heads
        self.head_dim = cfg.dim // cfg.n_heads
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * self.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        bsz, seq, _ = x.shape
        q = self.wq(x).view(bsz, seq, self.n_heads, self.head_dim)
        k = self.wk(x).view(bsz, seq, self.n_kv_heads, self.head_dim)
        v = self.wv(x).view(bsz, seq, self.n_kv_heads, self.head_dim)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        repeat = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(repeat, dim=2), v.repeat_interleave(repeat, dim=2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.wo(out.transpose(1, 2).reshape(bsz, seq, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self._drop(self.attention(self.attention_norm(x), cos, sin))
        return x + self._drop(self.feed_forward(self.ffn_norm(x)))

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        # Skipped entirely at p=0, so configs without dropout draw no random numbers.
        return F.dropout(x, self.dropout, self.training) if self.dropout else x


class Llama(nn.Module):
    """Decoder-only transformer; `forward(tokens)` returns logits (batch, seq, vocab)."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        cos, sin = rotary_tables(cfg.dim // cfg.n_heads, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def init_buffers(self) -> None:
        """Recomputes the rotary tables in place (they are in no checkpoint: after `to_empty`
        they hold garbage)."""
        cfg = self.cfg
        cos, sin = rotary_tables(cfg.dim // cfg.n_heads, cfg.max_seq_len, cfg.rope_theta)
        with torch.no_grad():
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)

    def reset_parameters(self) -> None:
        std = 0.02
        for name, param in self.named_parameters():
            if param.dim() == 1:
                continue  # norm weights stay at 1
            residual = name.endswith(("wo.weight", "w2.weight"))
            scale = 1 / math.sqrt(2 * self.cfg.n_layers) if residual else 1
            nn.init.normal_(param, mean=0.0, std=std * scale)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        h = self.tok_embeddings(tokens)
        cos, sin = self.rope_cos[:seq], self.rope_sin[:seq]
        for layer in self.layers:
            h = layer(h, cos, sin)
        return self.output(self.norm(h)).float()


def build_model(preset: str | LlamaConfig, *, seed: int = 0,
                device: str | torch.device = "cpu") -> Llama:
    """Builds the model with deterministic initial weights (same seed: same weights on every
    rank)."""
    cfg = PRESETS[preset] if isinstance(preset, str) else preset
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Llama(cfg)
    return model.to(device)


def build_sharded(preset: str | LlamaConfig, *, device: str | torch.device = "cpu",
                  mesh: Any = None) -> Llama:
    """The model sharded with FSDP2 (each block, then the whole) with only this rank's shards
    allocated on `device` and left uninitialized: fill them with `load_or_init`."""
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415 - needs torch.distributed

    cfg = PRESETS[preset] if isinstance(preset, str) else preset
    with torch.device("meta"):
        model = Llama(cfg)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device=device)
    model.init_buffers()
    return model


def load_or_init(model: Llama, optimizer: torch.optim.Optimizer | None, *,
                 seed: int = 0) -> Any:
    """`ray_resilience.load_checkpoint` into a model from `build_sharded`: the newest
    checkpoint's shards when one exists, else `build_model(seed)`'s weights (built once on the
    CPU, each rank keeping its shards), so both starts match a model built unsharded."""
    from torch.distributed.checkpoint.state_dict import (  # noqa: PLC0415 - needs torch.distributed
        StateDictOptions,
        set_model_state_dict,
    )

    import ray_resilience as rr  # noqa: PLC0415 - the example model imports no Ray otherwise

    loaded = rr.load_checkpoint(model=model, optimizer=optimizer)
    if loaded is None:
        full = build_model(model.cfg, seed=seed).state_dict()
        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True))
    return loaded


def causal_lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
