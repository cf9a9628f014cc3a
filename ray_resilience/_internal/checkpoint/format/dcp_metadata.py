"""DCP `.metadata`: built from the ranks' shard reports, read back with a restricted unpickler
(DCP's own reader calls `pickle.load`): only DCP's types, and only plain file names.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterable

import torch
from torch.distributed.checkpoint import metadata as dcp_md
from torch.distributed.checkpoint.default_planner import create_default_global_save_plan
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.planner import SavePlan, WriteItem

from ray_resilience._internal.checkpoint.format import layout
from ray_resilience.checkpoint.errors import UnsafeCheckpointError

DCP_VERSION = "1.0.0"  # the `version` torch's FileSystemWriter stamps (CURRENT_DCP_VERSION)

_ALLOWED: dict[tuple[str, str], object] = {
    ("torch.distributed.checkpoint.metadata", name): getattr(dcp_md, name)
    for name in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                 "ChunkStorageMetadata", "TensorProperties", "MetadataIndex", "StorageMeta",
                 "_MEM_FORMAT_ENCODING")
}
_ALLOWED[("torch.distributed.checkpoint.filesystem", "_StorageInfo")] = _StorageInfo
_ALLOWED[("torch", "Size")] = torch.Size
_ALLOWED[("torch.serialization", "_get_layout")] = torch.serialization._get_layout
_TORCH_NAMES = (
    "float64", "float32", "float16", "bfloat16", "complex128", "complex64", "int64", "int32",
    "int16", "int8", "uint8", "uint16", "uint32", "uint64", "bool", "float8_e4m3fn",
    "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "strided", "sparse_coo",
    "contiguous_format", "channels_last", "preserve_format")
_ALLOWED.update({("torch", n): getattr(torch, n) for n in _TORCH_NAMES if hasattr(torch, n)})


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, path: str) -> None:
        super().__init__(io.BytesIO(data))
        self._path = path

    def find_class(self, module: str, name: str) -> object:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise UnsafeCheckpointError(
                self._path, f"metadata asks to unpickle {module}.{name}, which is not a DCP "
                            "metadata type; refusing to load it (possible tampering)") from None

    def persistent_load(self, pid: object) -> object:
        raise UnsafeCheckpointError(self._path, "metadata uses persistent ids; refusing to load it")


def loads_metadata(data: bytes | memoryview, *, path: str) -> dcp_md.Metadata:
    """Unpickles DCP metadata allowing only DCP's own types; checks its file references."""
    try:
        md = _RestrictedUnpickler(bytes(data), path).load()
    except UnsafeCheckpointError:
        raise
    except Exception as exc:
        raise UnsafeCheckpointError(
            path, f"metadata does not unpickle ({type(exc).__name__}: {exc})") from exc
    if not isinstance(md, dcp_md.Metadata) or not isinstance(md.storage_data, dict):
        raise UnsafeCheckpointError(path, "metadata is not a DCP Metadata with storage_data")
    for index, info in md.storage_data.items():
        if not isinstance(info, _StorageInfo) or not isinstance(index, dcp_md.MetadataIndex):
            raise UnsafeCheckpointError(path, f"storage entry {index!r} has an unexpected type")
        if info.transform_descriptors:
            raise UnsafeCheckpointError(path, f"{index.fqn}: stream transforms are not supported")
        layout.check_file_name(info.relative_path, where=f"{path} ({index.fqn})")
    return md


def dumps_metadata(md: dcp_md.Metadata) -> bytes:
    """Serializes metadata exactly as DCP does, so `torch.distributed.checkpoint.load` reads it."""
    return pickle.dumps(md)


def build_metadata(
    written: Iterable[tuple[list[WriteItem], dict[dcp_md.MetadataIndex, _StorageInfo]]],
    *, planner_data: dict, checkpoint_id: str, save_id: str,
) -> dcp_md.Metadata:
    """DCP metadata of a checkpoint from what each rank wrote; every item written by exactly
    one rank, as DCP's global planner requires."""
    plans, storage = [], {}
    for items, infos in written:
        plans.append(SavePlan(list(items)))
        storage.update(infos)
    _, md = create_default_global_save_plan(plans, rewrite_index_hints=False)
    md.planner_data = planner_data
    md.storage_data = storage
    md.storage_meta = dcp_md.StorageMeta(checkpoint_id=checkpoint_id, save_id=save_id)
    md.version = DCP_VERSION
    return md
