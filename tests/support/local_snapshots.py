"""A plain model's local-tier snapshots in one process: what the pipeline does for a local step
(a staging copy, then the file write) and the loader's local restore, for unit tests."""

from __future__ import annotations

import torch

from ray_resilience._internal.checkpoint.rank.loader import (
    LoadTarget,
    _apply,
    _local_offer,
    _newest_common,
    _try_local,
)
from ray_resilience._internal.checkpoint.rank.local.tier import LocalSnapshots, layout_digest
from ray_resilience._internal.checkpoint.rank.slots import LocalWrite
from ray_resilience._internal.checkpoint.rank.snapshot import StagingBuffers
from ray_resilience._internal.checkpoint.rank.state_cache import StateCache
from ray_resilience.examples.llama import build_model, causal_lm_loss


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    tokens = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(seed))
    causal_lm_loss(model(tokens[:, :-1]), tokens[:, 1:]).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _trained(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = build_model("tiny", seed=seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _step(model, optimizer, 1)
    return model, optimizer


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {f"p.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    for i, entry in enumerate(optimizer.state.values()):
        out.update({f"o.{i}.{k}": v.clone() for k, v in entry.items() if torch.is_tensor(v)})
    return out


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _save(store: LocalSnapshots, step: int, session: str, model, optimizer,
          extra: bytes = b"", cache: StateCache | None = None, *, direct: bool = False) -> bool:
    """What the pipeline does for a local step: a staging copy, then the file write; with
    `direct` (a local-only step on CPU), the copy straight into the file's mapping."""
    source = (cache or StateCache()).source(model, optimizer)
    target = LocalWrite(session, step, layout_digest(source.items))
    everything = list(range(len(source.tensors)))
    if direct:
        file, memory = store.begin_direct(StagingBuffers.length(source.items),
                                          sum(map(len, source.blobs)) + len(extra))
        buffers = StagingBuffers(source.items, source.tensors, memory=memory)
        buffers.copy_now(source.tensors, everything)
        return store.finish_direct(target, file, buffers.data, StagingBuffers.ALIGN,
                                   source.blobs, extra)
    buffers = StagingBuffers(source.items, source.tensors)
    buffers.copy_now(source.tensors, everything)
    return store.write(target, buffers.payload([], b"").arrays, source.blobs, extra)


def _restore(store: LocalSnapshots, model, optimizer):
    target = LoadTarget(rank=store.rank, storage=None, coordinator=None, memory_tier=False,
                        model=model, optimizer=optimizer, local=store)
    offer, own = _local_offer(target)
    key = _newest_common([offer])
    if key is None:
        return None
    state, loaded, error = _try_local(target, key, own)
    assert error is None, error
    _apply(model, optimizer, state)
    store.keep_only(*key)
    return loaded
