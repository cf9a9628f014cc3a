"""A rank's files in a step folder: the DCP data file (as torch's `FileSystemWriter` writes
it), the extra-state file, and the items file (a CRC-32C per item, so a rank that needs only
part of a data file reads and checks just that part); each with a whole-file checksum.

Writers save tensors as `torch.save` records without the zip format's own CRC32
(`skip_zip_crc`: torch computes it over every byte, ~0.25 s per GB here, and `torch.load` never
checks it); the items file's CRC-32C covers the same bytes.
"""

from __future__ import annotations

import io
import json
import warnings
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import WriteItem

from ray_resilience._internal.checkpoint.format import checksum, layout
from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage
from ray_resilience._internal.checkpoint.wire import (
    FileDigest,
    SaveTicket,
    ShardPayload,
    is_tensor_item,
)
from ray_resilience.checkpoint.errors import CheckpointCorruptError

_ONE_PASS_MIN_BYTES = 2**20
"""A write at least this large is read once for both checksums (~0.1 s per GB each) and the
results joined (`checksum.combine`); smaller ones are read twice, which costs less than a join."""


class _DigestStream:
    """Forwards writes to `out`, keeping the byte count and the running whole-file checksum
    (`checksum.CHECKSUM`)."""

    def __init__(self, out: Any) -> None:
        self._out, self.size, self.value = out, 0, 0
        self.item_crc = 0
        """The checksum (`checksum.CHECKSUM`) of what was written since it was last reset."""
        self.error: BaseException | None = None

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        try:
            self._out.write(view)
        except BaseException as exc:
            self.error = exc  # torch.save's zip writer replaces it with a vague RuntimeError
            raise
        if len(view) >= _ONE_PASS_MIN_BYTES:  # one pass, then two joins of ~20 us
            piece = checksum.checksum(checksum.CHECKSUM, view)
            self.value = checksum.combine(checksum.CHECKSUM, self.value, piece, len(view))
            self.item_crc = checksum.combine(checksum.CHECKSUM, self.item_crc, piece, len(view))
        else:
            self.value = checksum.checksum(checksum.CHECKSUM, view, self.value)
            self.item_crc = checksum.checksum(checksum.CHECKSUM, view, self.item_crc)
        self.size += len(view)
        return len(view)

    def flush(self) -> None:
        pass

    def tell(self) -> int:
        return self.size

    @property
    def digest(self) -> FileDigest:
        return FileDigest(self.size, self.value, checksum.CHECKSUM)


def as_tensor(array: np.ndarray, item: WriteItem) -> torch.Tensor:
    """The item's tensor over a flat uint8 array (no copy; the array may be read-only)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only plasma buffers; never written
        flat = torch.from_numpy(array)
    return flat.view(item.tensor_data.properties.dtype).view(item.tensor_data.chunk.sizes)


_BUFFERED_MAX_BYTES = 4 * 2**20
"""Tensors up to this size are `torch.save`d into memory and written once (torch's zip
writer makes ~40 small writes per tensor); larger ones stream."""


def _save_tensor(tensor: torch.Tensor, stream: _DigestStream) -> None:
    if tensor.numel() * tensor.element_size() <= _BUFFERED_MAX_BYTES:
        buffer = io.BytesIO()
        torch.save(tensor, buffer)
        stream.write(buffer.getbuffer())
        return
    try:
        torch.save(tensor, stream)
    except Exception:
        if stream.error is not None:
            raise stream.error from None  # the storage error (disk full, network), not torch's
        raise


def skip_zip_crc() -> None:
    """Every `torch.save` of this process leaves the zip records' CRC32 out (see the module
    docstring). For the writer processes only, which are ours: no user code saves there."""
    torch.serialization.set_crc32_options(False)


def write_shard(
    storage: CheckpointStorage, ticket: SaveTicket, payload: ShardPayload, *,
    direct: bool = False,
) -> tuple[dict[str, FileDigest], list[WriteItem], dict[MetadataIndex, _StorageInfo]]:
    """Writes the rank's data and extra files; returns their digests, the items written and
    where each landed (overwriting an earlier try of the same shard). `direct`: the data file
    bypasses the page cache where the file system allows (`CheckpointConfig.direct_io`)."""
    folder = ticket.dir_name
    storage.make_dir(folder)
    data_name = layout.data_file_name(ticket.rank)
    written, infos, item_crcs = [], {}, []
    with storage.open_output(f"{folder}/{data_name}", direct=direct) as out:
        stream = _DigestStream(out)
        arrays, blobs = iter(payload.arrays), iter(payload.blobs)
        for item, owned in zip(ticket.items, ticket.owned, strict=True):
            data = next(arrays) if is_tensor_item(item) else next(blobs)
            if not owned:
                continue
            offset, stream.item_crc = stream.size, 0
            if is_tensor_item(item):
                _save_tensor(as_tensor(data, item), stream)
            else:
                stream.write(data)
            written.append(item)
            infos[item.index] = _StorageInfo(data_name, offset, stream.size - offset)
            item_crcs.append([offset, stream.size - offset, stream.item_crc])
    digests = {data_name: stream.digest}
    for name, content in ((layout.extra_file_name(ticket.rank), payload.extra),
                          (layout.items_file_name(ticket.rank), json.dumps(
                              {"checksum": checksum.CHECKSUM, "items": item_crcs}).encode())):
        with storage.open_output(f"{folder}/{name}") as out:
            side = _DigestStream(out)
            side.write(content)
        digests[name] = side.digest
    return digests, written, infos


def item_checksums(data: memoryview, *, where: str) -> dict[int, tuple[int, str, int]]:
    """offset -> (length, checksum name, value) from a rank's items file."""
    try:
        doc = json.loads(bytes(data))
        name = doc["checksum"]
        table = {int(o): (int(n), name, int(c)) for o, n, c in doc["items"]}
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointCorruptError(where, f"unreadable item checksums ({exc})") from None
    if not checksum.known_checksum(name):
        raise CheckpointCorruptError(where, f"unknown checksum {name!r}")
    return table


def read_item(storage: CheckpointStorage, folder: str, name: str, offset: int, length: int,
              expected: tuple[int, str, int] | None) -> memoryview:
    """`length` bytes at `offset` of a data file, checked against its item checksum."""
    where = storage.display(f"{folder}/{name}")
    if expected is None or expected[0] != length:
        raise CheckpointCorruptError(where, f"no item checksum for the {length} bytes at {offset}")
    data = storage.read_range(f"{folder}/{layout.check_file_name(name, where=where)}", offset,
                              length)
    if len(data) != length:
        raise CheckpointCorruptError(where, f"{len(data)} bytes at {offset}, expected {length}")
    actual = checksum.checksum(expected[1], data)
    if actual != expected[2]:
        raise CheckpointCorruptError(where, f"{expected[1]} of the {length} bytes at {offset} is "
                                            f"{actual:#010x}, the items file says "
                                            f"{expected[2]:#010x}")
    return data


def read_verified(storage: CheckpointStorage, folder: str, name: str,
                  expected: FileDigest) -> memoryview:
    """A whole file of a committed step, checked against the manifest's size and checksum."""
    rel = f"{folder}/{layout.check_file_name(name, where=storage.display(folder))}"
    try:
        data = storage.read_bytes(rel)
    except FileNotFoundError:
        raise CheckpointCorruptError(storage.display(rel), "the file is missing") from None
    if len(data) != expected.size:
        raise CheckpointCorruptError(storage.display(rel),
                                     f"size {len(data)} bytes, the manifest says {expected.size}")
    actual = checksum.checksum(expected.checksum, data)
    if actual != expected.value:
        raise CheckpointCorruptError(storage.display(rel),
                                     f"{expected.checksum} {actual:#010x}, "
                                     f"the manifest says {expected.value:#010x}")
    return data
