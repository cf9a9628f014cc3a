"""A restore from storage loads large tensors straight into the model's and optimizer's memory
(`DirectItems`): bit-equal to what was saved, the same as the `torch.load` path, every record
checked against its CRC-32C (a flipped byte of tensor data or of a zip header is caught), and
records of another shape (resharding, another dtype) left to the `torch.load` path."""

from __future__ import annotations

import errno
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from ray_resilience._internal.checkpoint.format.commit import read_manifest
from ray_resilience._internal.checkpoint.format.direct import files as direct_files
from ray_resilience._internal.checkpoint.format.direct import records as direct_items
from ray_resilience._internal.checkpoint.format.readers import SafeLoadPlanner, StorageShardReader
from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage
from ray_resilience._internal.checkpoint.rank.snapshot import state_dict_of
from ray_resilience.checkpoint.errors import CheckpointStorageError
from tests.support.single_rank import flat_state, write_single_rank

pytestmark = pytest.mark.timeout(60)


def _trained(seed: int, dtype: torch.dtype = torch.float32):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 8)).to(dtype)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 512, dtype=dtype)).sum().backward()
    optimizer.step()
    return model, optimizer



def _load(storage, step_dir, model, optimizer, *, direct=True) -> StorageShardReader:
    reader = StorageShardReader(storage, read_manifest(storage, step_dir), direct=direct)
    state = state_dict_of(model, optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, storage_reader=reader, planner=SafeLoadPlanner(), no_dist=True)
    return reader


@pytest.fixture
def saved(tmp_path):
    storage = CheckpointStorage.for_run(str(tmp_path), "run")
    model, optimizer = _trained(seed=1)
    step_dir = write_single_rank(storage, model, optimizer, 10, {}, direct=True)
    return storage, step_dir, flat_state(model, optimizer)


@pytest.mark.parametrize("min_bytes, direct", [(2**20, True), (2**40, True), (2**20, False)],
                         ids=["direct", "torch-load", "direct_io-off"])
def test_large_items_load_straight_into_the_targets_bit_equal(saved, monkeypatch, min_bytes,
                                                               direct):
    storage, step_dir, expected = saved
    monkeypatch.setattr(direct_items, "MIN_BYTES", min_bytes)
    model, optimizer = _trained(seed=2)
    reader = _load(storage, step_dir, model, optimizer, direct=direct)
    # The first layer's 2 MB weight and its two AdamW moments: the others are small.
    assert reader.direct_items == (3 if min_bytes == 2**20 and direct else 0)
    got = flat_state(model, optimizer)
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)


@pytest.mark.parametrize("where", ["data", "header"])
def test_a_flipped_byte_in_a_directly_loaded_record_is_caught(saved, where):
    storage, step_dir, _ = saved
    reader = StorageShardReader(storage, read_manifest(storage, step_dir))
    big = max(reader.read_metadata().storage_data.values(), key=lambda i: i.length)
    at = big.offset + (big.length // 2 if where == "data" else 40)
    path = storage.path(f"{step_dir.name}/__0_0.distcp")
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))
    model, optimizer = _trained(seed=2)
    with pytest.raises(CheckpointException, match="the items file says|shape|unpickl|zip"):
        _load(storage, step_dir, model, optimizer)


def test_a_target_of_another_dtype_loads_through_torch_load(saved):
    storage, step_dir, expected = saved
    model, optimizer = _trained(seed=2, dtype=torch.float64)
    reader = _load(storage, step_dir, model, optimizer)
    assert reader.direct_items == 0
    got = flat_state(model, optimizer)
    assert torch.equal(got["m.0.weight"], expected["m.0.weight"].double())


def test_an_io_error_in_a_direct_read_is_a_typed_storage_error_naming_the_file(saved,
                                                                               monkeypatch):
    storage, step_dir, _ = saved

    def broken(fd, buffers, offset):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(direct_files.os, "preadv", broken)
    model, optimizer = _trained(seed=2)
    with pytest.raises(CheckpointException) as info:
        _load(storage, step_dir, model, optimizer)
    failure = next(iter(info.value.failures.values()))
    inner = failure[0] if isinstance(failure, tuple) else failure
    assert isinstance(inner, CheckpointStorageError) and "__0_0.distcp" in str(inner)
