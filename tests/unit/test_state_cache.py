"""The save plan cache (`StateCache`): reused while the state keeps its tensors, rebuilt the
moment any of them is replaced, so a save never copies from a tensor training no longer uses.

One process, no Ray: a plain model and AdamW (the FSDP2 path runs in the checkpoint tests).
"""

from __future__ import annotations

import copy

import pytest
import torch

from ray_resilience._internal.checkpoint.rank.state_cache import StateCache
from ray_resilience.examples.llama import build_model, causal_lm_loss

pytestmark = pytest.mark.timeout(60)


def _trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = build_model("tiny", seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _step(model, optimizer)
    return model, optimizer


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    tokens = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(1))
    causal_lm_loss(model(tokens[:, :-1]), tokens[:, 1:]).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _ptrs(source) -> set[int]:
    return {t.data_ptr() for t in source.tensors}


def _live_ptrs(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> set[int]:
    live = {p.data_ptr() for p in model.parameters()}
    for entry in optimizer.state.values() if optimizer is not None else ():
        live.update(v.data_ptr() for v in entry.values() if torch.is_tensor(v) and v.dim())
    return live


def test_plan_is_reused_across_steps():
    model, optimizer = _trained()
    cache = StateCache()
    first = cache.source(model, optimizer)
    _step(model, optimizer)
    again = cache.source(model, optimizer)
    assert again.tensors is first.tensors and again.plan_id == first.plan_id


@pytest.mark.parametrize("change", ["reload_optimizer", "state_value", "param_data", "new_module",
                                    "new_group_param", "deep_module", "state_key", "buffer"])
def test_any_replaced_tensor_rebuilds_the_plan(change):
    model, optimizer = _trained()
    cache = StateCache()
    if change == "deep_module":  # model only: the optimizer would still hold the old parameters
        optimizer = None
    first = cache.source(model, optimizer)
    if change == "reload_optimizer":  # new state tensors, same values
        optimizer.load_state_dict(optimizer.state_dict())
    elif change == "state_value":  # one optimizer-state tensor swapped for a copy
        entry = optimizer.state[next(model.parameters())]
        entry["exp_avg"] = entry["exp_avg"].clone()
    elif change == "param_data":  # same Parameter object, new storage
        param = next(model.parameters())
        param.data = param.data.clone()
    elif change == "deep_module":  # a module deep in the tree replaced (its parent is cached)
        model.layers[1].feed_forward = copy.deepcopy(model.layers[1].feed_forward)
    elif change == "state_key":  # one more value in one parameter's state
        optimizer.state[next(model.parameters())]["extra"] = torch.zeros(3)
    elif change == "buffer":  # a persistent buffer registered on a cached module
        model.layers[0].register_buffer("scale", torch.ones(2))
    else:
        model.extra_head = torch.nn.Linear(4, 4)  # a module added to the tree
        if change == "new_group_param":
            optimizer.add_param_group({"params": list(model.extra_head.parameters())})
    if change not in ("new_module", "deep_module", "state_key", "buffer"):
        _step(model, optimizer)
    again = cache.source(model, optimizer)
    assert again.tensors is not first.tensors
    assert _live_ptrs(model, optimizer) <= _ptrs(again)  # copies come from the live tensors
    if change in ("new_module", "new_group_param"):
        assert len(again.tensors) > len(first.tensors)


def test_a_copy_made_later_finds_replaced_storage_and_the_next_source_rebuilds():
    """With the copy after `save` (`copies_later`), parameters' and moments' storage is checked
    by the copier (`SaveSource.moved`), not at every save; once it found one replaced, the
    cache rebuilds and checks storage at every save from then on."""
    model, optimizer = _trained()
    cache = StateCache()
    def later(nbytes: int) -> bool:
        return True

    first = cache.source(model, optimizer, later)
    assert first.moved(first.overlap) is None
    param = next(model.parameters())
    param.data = param.data.clone()
    again = cache.source(model, optimizer, later)
    assert again.tensors is first.tensors  # not checked here ...
    assert again.moved(again.overlap) == "model." + next(n for n, _ in model.named_parameters())
    again.on_moved()  # ... but where it is copied
    rebuilt = cache.source(model, optimizer, later)
    assert rebuilt.tensors is not first.tensors and _live_ptrs(model, optimizer) <= _ptrs(rebuilt)
    assert rebuilt.moved(rebuilt.overlap) is None
    param.data = param.data.clone()  # from now on caught at the save itself
    assert cache.source(model, optimizer, later).tensors is not rebuilt.tensors


def test_a_shared_module_is_walked_once():
    model, optimizer = _trained()
    model.alias = model.layers[0]  # the same module under two names
    cache = StateCache()
    source = cache.source(model, optimizer)
    assert cache.source(model, optimizer).tensors is source.tensors
    assert _live_ptrs(model, optimizer) <= _ptrs(source)
