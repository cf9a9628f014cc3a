"""Records that travel between ranks, writers and the commit coordinator (all picklable), and
the calls a writer makes on the actor that hosts a rank's checkpointer (`SnapshotSource`).
Importing it imports no torch: DCP types load when a record holding them is unpickled.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from ray_resilience._internal.checkpoint.format import layout

if TYPE_CHECKING:  # torch's types, imported where they are first unpickled (not at start-up)
    import numpy as np
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import WriteItem

    from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage
    from ray_resilience.checkpoint.config import CheckpointConfig


def is_tensor_item(item: WriteItem) -> bool:
    return item.type.name != "BYTE_IO"  # WriteItemType.BYTE_IO, without importing torch here


def item_nbytes(item: WriteItem) -> int:
    if not is_tensor_item(item):
        return 0
    numel = 1
    for size in item.tensor_data.chunk.sizes:
        numel *= size
    return numel * item.tensor_data.properties.dtype.itemsize


def aligned_spans(sizes: list[int], align: int) -> tuple[list[tuple[int, int]], int]:
    """(offset, size) of each of `sizes` laid out in order, each at a multiple of `align`, and
    the length of the whole (the last end rounded up to `align`)."""
    spans, at = [], 0
    for n in sizes:
        spans.append((at, n))
        at += -(-n // align) * align
    return spans, at


def layout_key(items: list[WriteItem]) -> tuple:
    """What a snapshot must match to be copied into a rank's state (names, offsets, shapes,
    dtypes)."""
    return tuple(
        (i.index.fqn, tuple(i.index.offset or ()), i.type.value,
         tuple(i.tensor_data.chunk.sizes) if i.tensor_data else (),
         str(i.tensor_data.properties.dtype) if i.tensor_data else "")
        for i in items)


NEED_PLAN = "need_plan"
"""A writer's answer to a ticket naming a plan it does not hold: send it again with the items."""


@dataclasses.dataclass
class SaveTicket:
    """One rank's part of one save: what the writer needs besides the bytes."""

    session: str
    step: int
    rank: int
    world_size: int
    items: list[WriteItem] | None
    """Every local item in payload order; None on the wire once the writer holds the plan."""
    owned: list[bool]
    """Per item: this rank writes it to storage (replicated items are written by one rank)."""
    planner_data: dict | None
    """DCP's planner data of the plan (None on the wire with `items`)."""
    staged_at: float
    """Wall-clock time the training thread took the snapshot (save latency starts here)."""
    plan_id: str = ""
    """The save plan's id (`StateCache`): what a writer caches `items` and `planner_data` by."""
    data_nbytes: int = 0
    """The size of the snapshot's flat tensor array: the buffer a writer lends for it."""

    @property
    def dir_name(self) -> str:
        return layout.step_dir_name(self.step, self.session)

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.session, self.step, self.rank)


@dataclasses.dataclass
class ShardPayload:
    """A rank's snapshot: its tensor bytes in one flat uint8 array (item i at `spans[i]`), its
    byte items and extra state."""

    data: np.ndarray
    spans: list[tuple[int, int]]
    blobs: list[bytes]
    extra: bytes
    keep: Any = dataclasses.field(default=None, compare=False, repr=False)
    """What `data` lives in while this payload does (a writer's `shm.Lease`); never pickled."""

    def __getstate__(self) -> dict:
        return {**self.__dict__, "keep": None}

    @classmethod
    def packed(cls, data: np.ndarray, sizes: list[int], blobs: list[bytes], extra: bytes,
               align: int = 1) -> ShardPayload:
        """`sizes` laid out in order from offset 0, each at a multiple of `align`."""
        return cls(data, aligned_spans(sizes, align)[0], blobs, extra)

    @property
    def arrays(self) -> list[np.ndarray]:
        """Flat uint8 views of the tensor items, in item order."""
        data = self.data
        return [data[offset:offset + n] for offset, n in self.spans]

    @property
    def nbytes(self) -> int:
        return sum(n for _, n in self.spans) + sum(map(len, self.blobs)) + len(self.extra)


@dataclasses.dataclass
class FilledPayload:
    """A rank's answer to a writer that lent it a buffer (`shm.BufferHandle`): the snapshot's
    tensor bytes are in the buffer now; the rest of its `ShardPayload` travels here."""

    spans: list[tuple[int, int]]
    blobs: list[bytes]
    extra: bytes


@dataclasses.dataclass(frozen=True)
class FileDigest:
    """A whole file's size and checksum (`value` of the algorithm `checksum` names)."""

    size: int
    value: int
    checksum: str = "crc32"


@dataclasses.dataclass
class ShardReport:
    """Writer -> coordinator: one rank's shard of a step is durable."""

    session: str
    step: int
    rank: int
    world_size: int
    writer_id: str
    files: dict[str, FileDigest]
    written_items: list[WriteItem]
    storage_infos: dict[MetadataIndex, _StorageInfo]
    planner_data: dict
    staged_at: float
    durable_at: float
    nbytes: int


@dataclasses.dataclass
class ShardOutcome:
    """Writer -> rank: how the rank's save ended (durable or given up, with the error)."""

    session: str
    step: int
    ok: bool
    error: str | None = None
    write_s: float = 0.0


@dataclasses.dataclass
class MemoryEntry:
    """A committed shard held by a writer: `boxed[0]` is its `ShardPayload` (in the writer's
    shared memory) or the writer-owned object-store object holding it. Sent to a loading rank,
    the payload is replaced by `shm` (where on its node the rank maps the tensor bytes, and the
    rest of the payload) or by an object."""

    session: str
    step: int
    items: list[WriteItem]
    boxed: list[Any]
    nbytes: int
    shm: tuple[Any, FilledPayload] | None = None
    """(`shm.BufferHandle`, the payload without its tensor bytes), on the wire to a rank on the
    writer's node."""
    lent: str | None = None
    """The token the loader gives back (`CheckpointWriter.return_lent`) once it has read `shm`."""


@dataclasses.dataclass(frozen=True)
class RankCheckpointSpec:
    """Everything a rank's `RankCheckpointer` needs. Picklable; passed to the worker actor."""

    storage: CheckpointStorage
    config: CheckpointConfig
    coordinator: Any
    writer: Any
    writer_id: str
    rank: int
    world_size: int
    local_root: str | None = None
    """This run's local-tier folder prefix (`local_tier.node_root` adds the node; None: off)."""


class SnapshotSource:
    """The calls a checkpoint writer makes on the actor it takes a rank's snapshots from (the
    `exporter` a `RankCheckpointer` is built with), for an actor class to inherit: each goes to
    `snapshot_source()`, the rank's checkpointer (or what forwards to it), and answers "nothing"
    while there is none."""

    def snapshot_source(self) -> Any:
        """This actor's `RankCheckpointer`, or an object forwarding these calls to it; None
        when it has none (not built yet, or closed)."""
        raise NotImplementedError

    def export_snapshot(self, export_id: str, into: Any = None) -> Any:
        """A snapshot offered under `export_id`, for the writer to take: copied into `into` (a
        buffer the writer lends) or returned (the object is the writer's then); None when given
        up, or when there is no checkpointer any more."""
        source = self.snapshot_source()
        return None if source is None else source.export_snapshot(export_id, into)

    def snapshot_taken(self, export_id: str, kept: bool = False) -> bool:
        """The writer took the snapshot offered under `export_id` from shared memory (`kept`: it
        adopted that memory); False when the rank gave it up first (what was taken may be
        torn)."""
        source = self.snapshot_source()
        return source is not None and source.snapshot_taken(export_id, kept)

    def take_spare(self, handle: Any) -> bool:
        """The writer gives back shared memory for the rank's next snapshot slot; False when
        not taken (the writer keeps it)."""
        source = self.snapshot_source()
        return source is not None and source.take_spare(handle)
