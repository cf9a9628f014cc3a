"""A restore from storage into an FSDP2 model (DTensor shards, a 1-rank gloo group) takes the
direct path for every item and ends bit-equal to what was saved."""

from __future__ import annotations

import socket
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

from ray_resilience._internal.checkpoint.format.commit import read_manifest
from ray_resilience._internal.checkpoint.format.direct import records as direct_items
from ray_resilience._internal.checkpoint.format.readers import SafeLoadPlanner, StorageShardReader
from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage
from ray_resilience._internal.checkpoint.rank.snapshot import state_dict_of
from tests.support.single_rank import flat_state, write_single_rank

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def one_rank_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _trained(seed: int):
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415 - needs torch.distributed

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 8))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 64)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_fsdp2_shards_load_directly_and_bit_equal(tmp_path, monkeypatch, one_rank_group):
    monkeypatch.setattr(direct_items, "MIN_BYTES", 1)
    storage = CheckpointStorage.for_run(str(tmp_path), "run")
    model, optimizer = _trained(seed=1)
    expected = {k: v.full_tensor().clone() if hasattr(v, "full_tensor") else v.clone()
                for k, v in flat_state(model, optimizer).items()}
    step_dir = write_single_rank(storage, model, optimizer, 10, {}, direct=True)
    fresh, fresh_optim = _trained(seed=2)
    reader = StorageShardReader(storage, read_manifest(storage, step_dir))
    state = state_dict_of(fresh, fresh_optim)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=True)
    got = flat_state(fresh, fresh_optim)
    assert reader.direct_items >= 8  # 4 parameters, each with 2 AdamW moments: all direct
    for key, value in expected.items():
        value2 = got[key].full_tensor() if hasattr(got[key], "full_tensor") else got[key]
        assert torch.equal(value2, value), key


def _fresh(seed: int, optimizer_type=torch.optim.AdamW):
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415 - needs torch.distributed

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 8))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = optimizer_type(model.parameters(), lr=1e-2, **(
        {"momentum": 0.9} if optimizer_type is torch.optim.SGD else {}))
    steps = []
    optimizer.register_step_pre_hook(lambda *_: steps.append(1))
    return model, optimizer, steps


def _layout(state: dict) -> dict:
    return {k: (type(v).__name__, tuple(v.shape), v.dtype) for k, v in state.items()
            if isinstance(v, torch.Tensor)}


def test_a_fresh_adamw_gets_its_state_without_a_step_and_loads_bit_equal(tmp_path,
                                                                          one_rank_group):
    """A restore lists a fresh optimizer's state to load into: torch steps it once with zero
    gradients for that, ours builds AdamW's entries directly. Same entries (names, tensor
    types, shapes, dtypes), no step, and a load into them restores the saved values exactly."""
    storage = CheckpointStorage.for_run(str(tmp_path), "run")
    model, optimizer = _trained(seed=1)
    expected = {k: v.full_tensor().clone() if hasattr(v, "full_tensor") else v.clone()
                for k, v in flat_state(model, optimizer).items()}
    step_dir = write_single_rank(storage, model, optimizer, 10, {}, direct=True)

    theirs, theirs_optim, their_steps = _fresh(seed=2)
    torch_way = get_optimizer_state_dict(theirs, theirs_optim)["state"]
    ours, ours_optim, our_steps = _fresh(seed=2)
    state = state_dict_of(ours, ours_optim)
    assert their_steps == [1] and our_steps == []
    assert {f: _layout(e) for f, e in state["optimizer"]["state"].items()} == {
        f: _layout(e) for f, e in torch_way.items()}
    assert len(torch_way) == 4  # 2 layers x (weight, bias), each with step and 2 moments
    assert all(p.grad is None for p in ours.parameters())

    reader = StorageShardReader(storage, read_manifest(storage, step_dir))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=True)
    got = flat_state(ours, ours_optim)
    assert set(got) == set(expected)
    for key, value in expected.items():
        value2 = got[key].full_tensor() if hasattr(got[key], "full_tensor") else got[key]
        assert torch.equal(value2, value), key


def test_other_optimizers_keep_torchs_way_of_listing_a_fresh_state(one_rank_group):
    model, optimizer, steps = _fresh(seed=3, optimizer_type=torch.optim.SGD)
    state_dict_of(model, optimizer)
    assert steps == [1] and optimizer.state  # torch's zero-gradient step made the momentum
