"""Checkpoint format without Ray: names, extra state, DCP layout, checksums, safe metadata."""

from __future__ import annotations

import math
import os
import pickle
import warnings

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.utils.serialization import config as serialization_config

from ray_resilience._internal.checkpoint.format import checksum, layout
from ray_resilience._internal.checkpoint.format.commit import read_manifest
from ray_resilience._internal.checkpoint.format.dcp_metadata import (
    dumps_metadata,
    loads_metadata,
)
from ray_resilience._internal.checkpoint.format.extra_codec import decode_extra, encode_extra
from ray_resilience._internal.checkpoint.format.readers import SafeLoadPlanner, StorageShardReader
from ray_resilience._internal.checkpoint.format.shard_io import item_checksums, read_verified
from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage
from ray_resilience._internal.checkpoint.rank.snapshot import state_dict_of
from ray_resilience._internal.checkpoint.rank.state_cache import StateCache
from ray_resilience.checkpoint.errors import (
    CheckpointCorruptError,
    CheckpointStateError,
    UnsafeCheckpointError,
)
from ray_resilience.examples.llama import build_model, causal_lm_loss
from tests.support.single_rank import flat_state, write_single_rank

pytestmark = pytest.mark.timeout(60)
SESSION = "0123456789abcdef"


# --- names ------------------------------------------------------------------------------------

def test_step_dir_names_round_trip_and_sort_by_step():
    names = [layout.step_dir_name(s, SESSION) for s in (7, 120, 3)]
    parsed = sorted(layout.parse_step_dir(n) for n in names)
    assert [d.step for d in parsed] == [3, 7, 120] and parsed[0].name == names[2]


@pytest.mark.parametrize("name", ["..", "step_../..", "step_000000000001_../x",
                                  "step_1_0123456789abcdef", "step_000000000001_0123456789ABCDEF",
                                  "tmp", "step_000000000001",
                                  "step_000000000120_3f9c0a1b2c3d4e5f\n"])
def test_foreign_folder_names_are_ignored(name):
    assert layout.parse_step_dir(name) is None


@pytest.mark.parametrize("name", ["../__0_0.distcp", "/etc/passwd", "a/__0_0.distcp",
                                  "__0_0.distcp/..", "__x_0.distcp", "evil.pkl", "",
                                  "__0_0.distcp\n", ".metadata\n"])
def test_file_names_from_storage_cannot_leave_the_step_folder(name):
    with pytest.raises(UnsafeCheckpointError, match="not a checkpoint file name"):
        layout.check_file_name(name, where="manifest")


def test_bad_step_and_session_are_rejected():
    with pytest.raises(ValueError, match="step"):
        layout.step_dir_name(-1, SESSION)
    with pytest.raises(UnsafeCheckpointError):
        layout.step_dir_name(1, "../../etc")


# --- extra state ------------------------------------------------------------------------------

def test_extra_round_trips_values_and_tensors_exactly():
    torch.manual_seed(3)
    extra = {"rng": torch.get_rng_state(), "pos": 12345678901234, "lr": 3e-4, "nan": math.nan,
             "name": "run", "none": None, "flags": [True, False], "pair": (1, "a"),
             "nested": {"t": torch.randn(3, 4, dtype=torch.bfloat16), "empty": torch.zeros(0)}}
    back = decode_extra(encode_extra(extra), path="x")
    assert torch.equal(back["rng"], extra["rng"]) and back["rng"].dtype == torch.uint8
    assert back["pos"] == extra["pos"] and back["lr"] == extra["lr"] and math.isnan(back["nan"])
    assert back["pair"] == (1, "a") and isinstance(back["pair"], tuple)
    assert back["flags"] == [True, False]
    assert torch.equal(back["nested"]["t"], extra["nested"]["t"])
    assert back["nested"]["empty"].numel() == 0
    torch.set_rng_state(back["rng"])  # usable as an RNG state


def test_extra_tensors_are_copied_in_c_order_at_encode_time():
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    odd = {"t": base.t(), "grad": torch.ones(2, requires_grad=True),
           "mask": torch.tensor([True, False]), "conj": torch.tensor([1 + 2j, 3 - 1j]).conj(),
           "scalar": torch.tensor(7, dtype=torch.int16),
           "neg": torch._neg_view(torch.tensor([1.0, -2.0])), "offset": torch.arange(10)[3:7]}
    data = encode_extra(odd)
    base.add_(100)  # a change after the save returned must not reach it
    back = decode_extra(data, path="x")
    assert torch.equal(back["t"], torch.arange(12, dtype=torch.float32).reshape(3, 4).t())
    assert torch.equal(back["grad"], torch.ones(2)) and not back["grad"].requires_grad
    assert torch.equal(back["mask"], odd["mask"])
    assert back["scalar"].shape == () and int(back["scalar"]) == 7
    assert torch.equal(back["conj"], torch.tensor([1 - 2j, 3 + 1j]))
    assert torch.equal(back["neg"], torch.tensor([-1.0, 2.0]))
    assert torch.equal(back["offset"], torch.arange(3, 7))


@pytest.mark.parametrize("value, key", [
    ({"data": {"pos": np.int64(3)}}, "data.pos"),
    ({"x": object()}, "x"),
    ({"d": {1: "a"}}, "d.1"),
    ({"l": [1, {2, 3}]}, "l[1]"),
])
def test_extra_rejects_unsafe_values_naming_the_key(value, key):
    with pytest.raises(TypeError) as info:
        encode_extra(value)
    assert isinstance(info.value, CheckpointStateError) and repr(key) in str(info.value)


@pytest.mark.parametrize("mangle", [lambda b: b[:10], lambda b: b"X" + b[1:], lambda b: b[:-3]])
def test_corrupt_extra_raises_naming_the_path(mangle):
    data = encode_extra({"t": torch.arange(10)})
    with pytest.raises(CheckpointCorruptError, match="some/path"):
        decode_extra(mangle(data), path="some/path")


# --- DCP layout, single process ---------------------------------------------------------------

def _trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = build_model("tiny", seed=seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(seed))
    causal_lm_loss(model(tokens[:, :-1]), tokens[:, 1:]).backward()
    optimizer.step()
    return model, optimizer



@pytest.fixture
def storage(tmp_path) -> CheckpointStorage:
    return CheckpointStorage.for_run(str(tmp_path), "run")


@pytest.mark.parametrize("direct", [True, False], ids=["o-direct", "buffered"])
@pytest.mark.parametrize("zip_crc", [True, False], ids=["zip-crc", "as-writers-save"])
def test_stock_dcp_load_reads_our_checkpoint(storage, zip_crc, direct):
    model, optimizer = _trained(seed=1)
    # Writers leave torch.save's own zip CRC32 out (`skip_zip_crc`); stock loads never check it.
    with serialization_config.patch({"save.compute_crc32": zip_crc}):
        step_dir = write_single_rank(storage, model, optimizer, 10, {"k": 1}, direct=direct)
    manifest = read_manifest(storage, step_dir)
    assert {d.checksum for d in manifest.files.values()} == {checksum.CHECKSUM}
    fresh_model, fresh_optim = _trained(seed=2)
    state = state_dict_of(fresh_model, fresh_optim)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=storage.path(step_dir.name))
    expected = flat_state(model, optimizer)
    got = {f"m.{k}": v for k, v in state["model"].items()}
    got.update({f"o.{f}.{k}": v
                for f, e in state["optimizer"]["state"].items() for k, v in e.items()})
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[k], got[k]) for k in expected)
    assert state["optimizer"]["param_groups"][0]["lr"] == 1e-2


def test_safe_reader_loads_and_checks_every_file(storage):
    model, optimizer = _trained(seed=1)
    step_dir = write_single_rank(storage, model, optimizer, 10, {"k": 1})
    manifest = read_manifest(storage, step_dir)
    assert set(manifest.files) == {"__0_0.distcp", "__0_extra.json", "__0_items.json",
                                   ".metadata"}
    fresh_model, fresh_optim = _trained(seed=2)
    state = state_dict_of(fresh_model, fresh_optim)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, storage_reader=StorageShardReader(storage, manifest),
                 planner=SafeLoadPlanner(), no_dist=True)
    assert torch.equal(state["model"]["output.weight"], model.state_dict()["output.weight"])


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_damaged_shard_is_reported_with_its_path(storage, damage):
    model, optimizer = _trained(seed=1)
    step_dir = write_single_rank(storage, model, optimizer, 10, {})
    manifest = read_manifest(storage, step_dir)
    path = storage.path(f"{step_dir.name}/__0_0.distcp")
    if damage == "delete":
        os.remove(path)
    else:
        with open(path, "r+b") as f:
            if damage == "flip":
                f.seek(1000)
                byte = f.read(1)
                f.seek(1000)
                f.write(bytes([byte[0] ^ 0xFF]))
            else:
                f.truncate(100)
    with pytest.raises(CheckpointCorruptError) as info:
        read_verified(storage, step_dir.name, "__0_0.distcp", manifest.files["__0_0.distcp"])
    assert path in str(info.value)


def test_a_load_needing_part_of_a_file_reads_and_checks_only_those_bytes(storage, monkeypatch):
    """The model alone is a third of the file (parameters, then two AdamW moments each): it is
    read as byte ranges, each checked against the items file's CRC-32C, never the whole file."""
    model, optimizer = _trained(seed=1)
    step_dir = write_single_rank(storage, model, optimizer, 10, {})
    manifest = read_manifest(storage, step_dir)
    whole, ranges = [], []
    real_read, real_range = storage.read_bytes, storage.read_range
    monkeypatch.setattr(storage, "read_bytes", lambda rel: whole.append(rel) or real_read(rel))
    monkeypatch.setattr(storage, "read_range",
                        lambda rel, o, n: ranges.append(n) or real_range(rel, o, n))
    fresh_model, _ = _trained(seed=2)
    state = {"model": state_dict_of(fresh_model, None)["model"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, storage_reader=StorageShardReader(storage, manifest),
                 planner=SafeLoadPlanner(), no_dist=True)
    assert all(torch.equal(state["model"][k], v) for k, v in model.state_dict().items())
    assert not any(rel.endswith(".distcp") for rel in whole) and ranges
    assert 2 * sum(ranges) < manifest.files["__0_0.distcp"].size

    first = min(o for o, n in ((i.offset, i.length) for i in
                               StorageShardReader(storage, manifest).read_metadata()
                               .storage_data.values()))
    with open(storage.path(f"{step_dir.name}/__0_0.distcp"), "r+b") as f:
        f.seek(first + 600)  # inside the first item, past torch.save's zip header
        byte = f.read(1)
        f.seek(first + 600)
        f.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(CheckpointException, match="the items file says"), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load({"model": state_dict_of(fresh_model, None)["model"]},
                 storage_reader=StorageShardReader(storage, manifest), planner=SafeLoadPlanner(),
                 no_dist=True)


@pytest.mark.parametrize("name", ["crc32c", "crc32"])
def test_joined_checksums_equal_one_pass_over_both_pieces(name):
    rng = np.random.default_rng(7)
    for first_length, second_length in [(0, 0), (0, 9), (9, 0), (1, 1), (300, 4097),
                                        (5, 2**20 + 3), (2**21, 17)]:
        first = rng.integers(0, 256, first_length, dtype=np.uint8).tobytes()
        second = rng.integers(0, 256, second_length, dtype=np.uint8).tobytes()
        joined = checksum.combine(name, checksum.checksum(name, first),
                                  checksum.checksum(name, second), second_length)
        assert joined == checksum.checksum(name, first + second), (first_length, second_length)


@pytest.mark.parametrize("direct", [True, False], ids=["o-direct", "buffered"])
def test_files_with_multi_megabyte_tensors_check_out_whole_and_item_by_item(storage, direct,
                                                                           monkeypatch):
    """Writes of 1 MiB and more are read once for the file's and the item's checksum and the
    results joined: both must equal a plain pass over the bytes on storage."""
    joins = []
    real_combine = checksum.combine
    monkeypatch.setattr(checksum, "combine",
                        lambda *args: joins.append(args[3]) or real_combine(*args))
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(2, 1024)).sum().backward()
    optimizer.step()
    step_dir = write_single_rank(storage, model, optimizer, 10, {"k": 1}, direct=direct)
    assert joins and min(joins) >= 2**20  # the large tensors took the one-pass path
    manifest = read_manifest(storage, step_dir)
    for name, digest in manifest.files.items():
        read_verified(storage, step_dir.name, name, digest)  # raises on any mismatch
    data = storage.read_bytes(f"{step_dir.name}/{layout.data_file_name(0)}")
    table = item_checksums(storage.read_bytes(f"{step_dir.name}/{layout.items_file_name(0)}"),
                           where="items")
    assert max(length for length, _, _ in table.values()) >= 4 * 2**20
    assert sum(length for length, _, _ in table.values()) == len(data)
    for offset, (length, name, value) in table.items():
        assert checksum.checksum(name, data[offset:offset + length]) == value, offset


# --- metadata safety --------------------------------------------------------------------------

class _Exploit:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_metadata_unpickler_refuses_foreign_globals(tmp_path):
    marker = tmp_path / "pwned"  # this test's own: concurrent runs share /tmp
    with pytest.raises(UnsafeCheckpointError, match="posix.system|os.system"):
        loads_metadata(pickle.dumps(_Exploit(str(marker))), path="step/.metadata")
    assert not marker.exists()


def test_metadata_with_escaping_path_is_refused(storage):
    model, optimizer = _trained(seed=1)
    step_dir = write_single_rank(storage, model, optimizer, 10, {})
    md = loads_metadata(storage.read_bytes(f"{step_dir.name}/.metadata"), path="ok")
    index = next(iter(md.storage_data))
    md.storage_data[index].relative_path = "../../../etc/passwd"
    with pytest.raises(UnsafeCheckpointError, match="etc/passwd"):
        loads_metadata(dumps_metadata(md), path="tampered")


# --- what could never load is never saved -----------------------------------------------------

class _Warmup:
    """A schedule object kept in a param group: torch.save takes it, weights_only loads refuse."""

    def __init__(self) -> None:
        self.steps = 10


def test_a_state_item_that_could_never_load_is_refused_at_save_time():
    model = build_model("tiny", seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    optimizer.param_groups[0]["warmup"] = _Warmup()
    with pytest.raises(CheckpointStateError) as info:
        StateCache().source(model, optimizer)
    message = str(info.value)
    assert "optimizer.param_groups.0.warmup" in message and "_Warmup" in message
    assert "weights_only=True" in message
    optimizer.param_groups[0]["warmup"] = {"steps": 10}  # its settings instead: saved fine
    assert StateCache().source(model, optimizer).blobs
