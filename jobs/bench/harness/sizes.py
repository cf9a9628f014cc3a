"""State sizes the benchmarks run at: model shape, batch, step counts and detection timeout.

Each size keeps the AWS/NVRx schedule's shape (5 faults drawn by the same generator over the
run, never on rank 0) and scales the step count so a run takes about the same wall time at every
size. Every preset has dropout, so each rank draws random numbers every step and a checkpoint
must restore the RNG state for a recovered run to end bit-equal to the fault-free one.
"""

from __future__ import annotations

import dataclasses

from ray_resilience.examples.llama import PRESETS, LlamaConfig

DROPOUT = 0.1


@dataclasses.dataclass(frozen=True, kw_only=True)
class Size:
    """One state size of the sweep."""

    name: str
    model: LlamaConfig
    batch_size: int
    """Sequences per rank per step."""
    seq_len: int
    max_steps: int
    """Steps of a run in the full sweep."""
    quick_steps: int
    """Steps of a run under --quick."""
    detect_timeout_s: float
    """Hang detection for every mechanism: ours' step timeout, ft_launcher's rank heartbeat
    timeout, torchft's manager timeout, and the process-group timeout of the mechanisms whose
    only hang detector it is (torchrun, Ray Train)."""
    checkpoint_steps: int
    """Steps per configuration in the checkpoint benchmark."""
    checkpoint_intervals: tuple[int, ...]
    """Save intervals the checkpoint benchmark sweeps."""
    checkpoint_fresh_ranks: bool = False
    """Whether the checkpoint benchmark starts new rank processes for every configuration: at
    ~1 GB per rank, what one method leaves mapped (DCP's checkpoint daemon, a stager's shared
    memory) would crowd the next out of this machine's 24 GiB."""

    @property
    def state_bytes_per_rank(self) -> int:
        """fp32 parameters plus AdamW's two moments, sharded over 2 ranks."""
        return param_count(self.model) * 4 * 3 // 2


def param_count(cfg: LlamaConfig) -> int:
    head_dim = cfg.dim // cfg.n_heads
    attention = 2 * cfg.dim * cfg.n_heads * head_dim + 2 * cfg.dim * cfg.n_kv_heads * head_dim
    block = attention + 3 * cfg.dim * cfg.ffn_dim + 2 * cfg.dim
    return 2 * cfg.vocab_size * cfg.dim + cfg.n_layers * block + cfg.dim


def _with_dropout(cfg: LlamaConfig) -> LlamaConfig:
    return dataclasses.replace(cfg, dropout=DROPOUT)


SIZES: dict[str, Size] = {
    "tiny": Size(name="tiny", model=_with_dropout(PRESETS["tiny"]), batch_size=4, seq_len=64,
                 max_steps=200, quick_steps=60, detect_timeout_s=20.0,
                 checkpoint_steps=60, checkpoint_intervals=(1, 10)),
    # ~190 MB of fp32 parameters + AdamW state per rank.
    "200mb": Size(name="200mb", model=_with_dropout(PRESETS["small"]), batch_size=1, seq_len=32,
                  max_steps=30, quick_steps=20, detect_timeout_s=30.0,
                  checkpoint_steps=20, checkpoint_intervals=(2, 10)),
    # ~1.0 GB per rank: with every mechanism's copies (staging, memory tier, two local-tier
    # copies) two ranks stay well inside this machine's 24 GiB.
    "1gb": Size(name="1gb", model=_with_dropout(LlamaConfig(
        dim=1024, n_layers=9, n_heads=16, n_kv_heads=4, vocab_size=32000, ffn_dim=2816,
        max_seq_len=64)), batch_size=1, seq_len=16, max_steps=12, quick_steps=10,
        detect_timeout_s=60.0, checkpoint_steps=10, checkpoint_intervals=(5,),
        checkpoint_fresh_ranks=True),
}


def size(name: str) -> Size:
    if name not in SIZES:
        raise ValueError(f"size={name!r} is unknown; choose from {', '.join(SIZES)}.")
    return SIZES[name]
