"""DCP storage readers: a committed step in storage (checksums verified, metadata unpickled
safely; only the byte ranges a rank needs when that is under half a file) and a rank's snapshot
in writer memory; byte items load with `weights_only=True`.
"""

from __future__ import annotations

import io
from typing import Any

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint import metadata as dcp_md
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import (
    DefaultLoadPlanner,
    create_default_global_save_plan,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
)
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from ray_resilience._internal.checkpoint.format import layout, shard_io
from ray_resilience._internal.checkpoint.format.commit import Manifest
from ray_resilience._internal.checkpoint.format.dcp_metadata import loads_metadata
from ray_resilience._internal.checkpoint.format.direct import records as direct_items
from ray_resilience._internal.checkpoint.format.direct.files import DirectSource
from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage
from ray_resilience._internal.checkpoint.wire import ShardPayload, is_tensor_item
from ray_resilience.checkpoint.errors import CheckpointCorruptError, classify


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, except that byte items are loaded with `weights_only=True`."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


def _copy_into(planner: LoadPlanner, req: ReadItem, tensor: torch.Tensor, where: str) -> None:
    tensor = narrow_tensor_by_index(tensor, req.storage_offsets, req.lengths)
    target = planner.resolve_tensor(req).detach()
    if target.size() != tensor.size():
        raise CheckpointCorruptError(
            where, f"{req.storage_index.fqn}: stored chunk has shape {tuple(tensor.size())}, "
                   f"expected {tuple(target.size())}")
    target.copy_(tensor)
    planner.commit_tensor(req, target)


class _ReaderBase(StorageReader):
    def __init__(self) -> None:
        super().__init__()
        self.storage_data: dict = {}

    def reset(self, checkpoint_id: Any = None) -> None:
        self.storage_data = {}

    def set_up_storage_reader(self, metadata: dcp_md.Metadata, is_coordinator: bool,
                              *args: Any, **kwargs: Any) -> None:
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False


class StorageShardReader(_ReaderBase):
    """Reads a committed step; every file is checked against the manifest before use."""

    def __init__(self, storage: CheckpointStorage, manifest: Manifest, *,
                 direct: bool = True) -> None:
        super().__init__()
        self.storage, self.manifest, self.direct = storage, manifest, direct
        self.folder = manifest.step_dir.name
        self.metadata: dcp_md.Metadata | None = None
        self.direct_items = 0
        """Items loaded straight into their targets (`DirectItems`)."""

    def _read(self, name: str) -> memoryview:
        if name not in self.manifest.files:
            raise CheckpointCorruptError(self.storage.display(f"{self.folder}/{name}"),
                                         "the file is not listed in the commit manifest")
        return shard_io.read_verified(self.storage, self.folder, name, self.manifest.files[name])

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_md.Metadata:
        data = self._read(layout.METADATA_NAME)
        path = self.storage.display(f"{self.folder}/{layout.METADATA_NAME}")
        return loads_metadata(data, path=path)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[ReadItem]] = {}
        for req in plan.items:
            per_file.setdefault(self.storage_data[req.storage_index].relative_path, []).append(req)
        for name, reqs in per_file.items():
            where = self.storage.display(f"{self.folder}/{name}")
            reqs = self._direct(name, reqs, planner)
            if not reqs:
                continue
            parts = self._parts(name, reqs)
            for req in reqs:
                info = self.storage_data[req.storage_index]
                chunk = io.BytesIO(parts(info.offset, info.length, req.storage_index.fqn))
                if req.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(req, chunk)
                else:
                    tensor = torch.load(chunk, map_location="cpu", weights_only=True)
                    _copy_into(planner, req, tensor, where)
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def set_up_storage_reader(self, metadata: dcp_md.Metadata, is_coordinator: bool,
                              *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self.metadata = metadata

    def _direct(self, name: str, reqs: list[ReadItem], planner: LoadPlanner) -> list[ReadItem]:
        """Loads the large tensor items of `name` straight into their targets (`DirectItems`;
        a local file system and a step with item checksums only); returns the others."""
        rank = layout.file_rank(name)
        items = None if rank is None else layout.items_file_name(rank)
        infos = [self.storage_data[r.storage_index] for r in reqs]
        if not (self.direct and self.storage.is_local) or items not in self.manifest.files \
                or not any(i.length >= direct_items.MIN_BYTES for i in infos):
            return reqs
        where = self.storage.display(f"{self.folder}/{name}")
        table = shard_io.item_checksums(self._read(items),
                                        where=self.storage.display(f"{self.folder}/{items}"))
        rest = []
        rel = f"{self.folder}/{layout.check_file_name(name, where=where)}"
        try:
            with DirectSource(self.storage.path(rel)) as source:
                loader = direct_items.DirectItems(source, where, table)
                for req, info in zip(reqs, infos, strict=True):
                    meta = self.metadata.state_dict_metadata[req.storage_index.fqn]
                    if req.type == LoadItemType.BYTE_IO or not loader.load(
                            req, info.offset, info.length, meta.properties.dtype, planner):
                        rest.append(req)
        except FileNotFoundError:
            raise CheckpointCorruptError(where, "the file is missing") from None
        except EOFError as exc:
            raise CheckpointCorruptError(where, f"shorter than its items say ({exc})") from None
        except OSError as exc:  # only the file's reads raise it: typed like every storage read
            raise classify(exc, where, "read") from exc
        self.direct_items += loader.count
        return rest

    def _parts(self, name: str, reqs: list[ReadItem]) -> Any:
        """`get(offset, length, fqn)` for the items of `name` this load needs: sliced from the
        whole file (its checksum verified), or, when they are under half of it (a rank of a smaller
        world reading its share of another rank's file) and the step has an items file, read
        one by one and each checked against its CRC-32C."""
        where = self.storage.display(f"{self.folder}/{name}")
        spans = {(i.offset, i.length) for i in (self.storage_data[r.storage_index] for r in reqs)}
        digest = self.manifest.files.get(name)
        rank = layout.file_rank(name)
        items = None if rank is None else layout.items_file_name(rank)
        if digest is None or items not in self.manifest.files \
                or 2 * sum(n for _, n in spans) >= digest.size:
            data = self._read(name)

            def sliced(offset: int, length: int, fqn: str) -> memoryview:
                if offset < 0 or offset + length > len(data):
                    raise CheckpointCorruptError(where, f"{fqn}: item lies outside the file")
                return data[offset:offset + length]
            return sliced
        table = shard_io.item_checksums(self._read(items),
                                        where=self.storage.display(f"{self.folder}/{items}"))
        cache: dict[tuple[int, int], memoryview] = {}

        def ranged(offset: int, length: int, fqn: str) -> memoryview:
            if (offset, length) not in cache:
                cache[(offset, length)] = shard_io.read_item(
                    self.storage, self.folder, name, offset, length, table.get(offset))
            return cache[(offset, length)]
        return ranged


class MemoryShardReader(_ReaderBase):
    """Serves a rank's own snapshot from writer memory (the caller checked the layout matches)."""

    def __init__(self, items: list, payload: ShardPayload, where: str) -> None:
        super().__init__()
        self.where = where
        self._tensors: dict[dcp_md.MetadataIndex, Any] = {}
        self._blobs: dict[dcp_md.MetadataIndex, bytes] = {}
        arrays, blobs = iter(payload.arrays), iter(payload.blobs)
        for item in items:
            if is_tensor_item(item):
                self._tensors[item.index] = shard_io.as_tensor(next(arrays), item)
            else:
                self._blobs[item.index] = next(blobs)
        _, self._metadata = create_default_global_save_plan([SavePlan(list(items))],
                                                            rewrite_index_hints=False)
        self._metadata.storage_data = {index: index for index in (*self._tensors, *self._blobs)}

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_md.Metadata:
        return self._metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        for req in plan.items:
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, io.BytesIO(self._blobs[req.storage_index]))
            else:
                _copy_into(planner, req, self._tensors[req.storage_index], self.where)
        future: Future[None] = Future()
        future.set_result(None)
        return future
