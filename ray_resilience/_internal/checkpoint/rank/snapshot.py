"""The rank's state as DCP items, and reusable host buffers that snapshot it (pinned memory and
a side stream on GPU, a memcpy on CPU).
"""

from __future__ import annotations

import copy
import dataclasses
import io
import re
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.planner import WriteItem
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.distributed.tensor import DTensor

from ray_resilience._internal.checkpoint.shm import BufferHandle, SharedBuffer, node_here
from ray_resilience._internal.checkpoint.wire import (
    ShardPayload,
    aligned_spans,
    is_tensor_item,
    item_nbytes,
)
from ray_resilience.checkpoint.errors import CheckpointStateError

MODEL_KEY, OPTIMIZER_KEY = "model", "optimizer"
UNSTEPPED_KEY = "ray_resilience.unstepped_optimizer"
"""In a snapshot's extra state: its optimizer had no state yet (saved before its first step).
Listing a stateless optimizer's state makes torch create it (one step with zero gradients and
lr 0: AdamW gets zero moments and a step count of 1). The save empties it again, so training
goes on as without the save, and a load of that snapshot empties it too."""


def state_dict_of(model: torch.nn.Module,
                  optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """The (sharded) state dict saved and loaded: {"model": ..., "optimizer": ...}."""
    state = {MODEL_KEY: get_model_state_dict(model)}
    if optimizer is not None:
        init_adam_state(optimizer)
        state[OPTIMIZER_KEY] = get_optimizer_state_dict(model, optimizer)
    return state


def init_adam_state(optimizer: torch.optim.Optimizer) -> None:
    """Creates a stateless Adam's or AdamW's state (zero moments, step 0) without a step.

    To list a stateless optimizer's state, torch's `get_optimizer_state_dict` gives every
    parameter zero gradients and steps it once with lr 0; at a restore that step was 65-74% of a
    local-tier load (py-spy, ~200 MB per rank, AdamW: the moments' allocation and the step's
    arithmetic). Adam's own lazy initialization (`_init_group`) makes the same entries without
    the arithmetic; the gradients it looks for are left unwritten (`empty_like`) and dropped.
    The values differ from torch's (step 0, not 1) only where nothing reads them: a load
    overwrites every entry, and a state that nothing loaded into, or that a save created, is
    emptied again (`_forget_state`, UNSTEPPED_KEY). Other optimizers, or any failure here
    (`_init_group` is private), leave it to torch."""
    if type(optimizer) not in (torch.optim.Adam, torch.optim.AdamW) or optimizer.state:
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if any(p.grad is not None for p in params):  # torch's rule: such an optimizer is left as is
        return
    trained = [p for p in params if p.requires_grad]
    try:
        for p in trained:
            p.grad = torch.empty_like(p)
        for group in optimizer.param_groups:
            optimizer._init_group(group, [], [], [], [], [], [])
    except Exception:  # noqa: BLE001 - torch's own path follows
        optimizer.state.clear()
    finally:
        for p in trained:
            p.grad = None


def _signature_of(value: Any) -> tuple:
    if isinstance(value, DTensor):
        return ("D", tuple(value.shape), value.dtype, str(value.placements),
                tuple(value.device_mesh.get_coordinate() or ()), value.device.type)
    if isinstance(value, torch.Tensor):
        return ("T", tuple(value.shape), value.dtype, value.device.type)
    return ("B",)


@dataclasses.dataclass
class CapturedState:
    """The flattened state of one save; `items` is filled from the plan cache or rebuilt."""

    planner: DefaultSavePlanner
    signature: tuple

    def build_items(self) -> tuple[list[WriteItem], dict]:
        plan = self.planner.create_local_plan()
        return list(plan.items), dict(plan.planner_data or {})

    def sources(
        self, items: list[WriteItem], blob_cache: dict[str, tuple[Any, bytes]] | None = None,
    ) -> tuple[list[torch.Tensor], list[bytes]]:
        """The live local tensors of the tensor items, and the serialized byte items (reused from
        `blob_cache` while a value is unchanged)."""
        tensors, blobs = [], []
        cache = {} if blob_cache is None else blob_cache
        for item in items:
            if is_tensor_item(item):
                tensors.append(self.planner.resolve_data(item).detach())
            else:
                value = self.planner.lookup_object(item.index)
                blobs.append(serialize_item(item.index.fqn, value, cache))
        return tensors, blobs


def serialize_item(fqn: str, value: Any, cache: dict[str, tuple[Any, bytes]]) -> bytes:
    """`torch.save` bytes of a byte item's value, reused while the value stays equal; refused
    (CheckpointStateError) when loads, which use `weights_only=True`, could never read them."""
    cached = cache.get(fqn)
    if cached is None or type(cached[0]) is not type(value) or not _same(cached[0], value):
        buffer = io.BytesIO()
        torch.save(value, buffer)
        data = buffer.getvalue()
        _check_loadable(fqn, value, data)
        cached = cache[fqn] = (copy.deepcopy(value), data)
    return cached[1]


def _check_loadable(fqn: str, value: Any, data: bytes) -> None:
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any refusal means the checkpoint could never load
        text = str(exc)
        found = re.search(r"WeightsUnpickler error: (.*?)(?: Please use|\n|$)", text)
        detail = found.group(1) if found else text.strip().split("\n")[0][:300]
        raise CheckpointStateError(fqn, (
            f"a {type(value).__module__}.{type(value).__qualname__} would be saved but could "
            f"never be restored: loads use torch.load(weights_only=True), which refuses it "
            f"({detail}). Keep tensors, numbers, strings and containers of them in the model and "
            "optimizer state (e.g. a schedule's settings, not the object), or allow the class "
            "with torch.serialization.add_safe_globals on every rank"), where="state") from None


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values without a plain equality are re-serialized
        return False


def capture(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> CapturedState:
    planner = DefaultSavePlanner()
    planner.set_up_planner(state_dict_of(model, optimizer), is_coordinator=False)
    flat = planner.state_dict
    signature = tuple((fqn, _signature_of(flat[fqn])) for fqn in sorted(flat))
    return CapturedState(planner, signature)


class StagingBuffers:
    """Host buffers reused across saves: views into one flat allocation, handed on as one array.
    On CPU the allocation is shared memory (`shm.SharedBuffer`) that the node's writer adopts at
    the hand-off (`handle`; the slot then gets other memory), or memory the caller gives (a
    local-tier file's mapping); on GPU it is pinned memory, which the rank copies out itself."""

    ALIGN = 64

    def __init__(self, items: list[WriteItem], sources: list[torch.Tensor],
                 spare: Callable[[int], SharedBuffer | None] | None = None,
                 memory: np.ndarray | None = None) -> None:
        """`spare(nbytes)`: shared memory of that size to use (one the writer gave back), or
        None for a new allocation. `memory`: a writable uint8 array of at least
        `StagingBuffers.length(items)` bytes to lay the buffers over instead (CPU sources)."""
        tensor_items = [i for i in items if is_tensor_item(i)]
        self.key = tuple((tuple(i.tensor_data.chunk.sizes), i.tensor_data.properties.dtype)
                         for i in tensor_items)
        self._items = items
        self.spans, at = aligned_spans([item_nbytes(i) for i in tensor_items], self.ALIGN)
        self.shared: SharedBuffer | None = None
        if memory is not None:
            with warnings.catch_warnings():  # the mapping is writable: torch's warning is moot
                warnings.simplefilter("ignore")
                self.flat = torch.frombuffer(memory, dtype=torch.uint8, count=at) if at \
                    else torch.empty(0, dtype=torch.uint8)
        elif any(src.is_cuda for src in sources) or not at:
            self.flat = torch.empty(at, dtype=torch.uint8,
                                    pin_memory=any(src.is_cuda for src in sources))
        else:
            self.shared = (spare and spare(at)) or SharedBuffer(at, node_here())
            with warnings.catch_warnings():  # the mapping is writable: torch's warning is moot
                warnings.simplefilter("ignore")
                self.flat = torch.frombuffer(self.shared.array, dtype=torch.uint8)
        self.buffers = [self._view(item, offset, n)
                        for item, (offset, n) in zip(tensor_items, self.spans, strict=True)]
        self.data: np.ndarray = self.flat.numpy()
        self.nbytes = sum(n for _, n in self.spans)

    def close(self) -> None:
        """Drops the views and closes the shared memory: its pages go now unless another view of
        them is alive (then with it), or the writer adopted them (then with the writer's copy)."""
        self.buffers, self.flat, self.data = [], torch.empty(0, dtype=torch.uint8), np.empty(0)
        if self.shared is not None:
            self.shared.close()

    @classmethod
    def length(cls, items: list[WriteItem]) -> int:
        """Bytes the buffers of `items` take, padding included (`data`'s length)."""
        return aligned_spans([item_nbytes(i) for i in items if is_tensor_item(i)], cls.ALIGN)[1]

    def _view(self, item: WriteItem, offset: int, n: int) -> torch.Tensor:
        shape, dtype = tuple(item.tensor_data.chunk.sizes), item.tensor_data.properties.dtype
        if not n:
            return torch.empty(shape, dtype=dtype)
        return self.flat[offset:offset + n].view(dtype).view(shape)

    @property
    def handle(self) -> BufferHandle | None:
        """Where the node's writer maps these buffers (None: not shared, on GPU)."""
        return None if self.shared is None else self.shared.handle

    def payload(self, blobs: list[bytes], extra: bytes) -> ShardPayload:
        """The snapshot as one flat array (and the byte items and extra state) for the writer."""
        return ShardPayload(self.data, self.spans, blobs, extra)

    def matches(self, items: list[WriteItem]) -> bool:
        if items is self._items:  # the cached plan of the same state: same layout
            return True
        key = tuple((tuple(i.tensor_data.chunk.sizes), i.tensor_data.properties.dtype)
                    for i in items if is_tensor_item(i))
        return key == self.key

    def copy_now(self, sources: list[torch.Tensor], which: list[int]) -> None:
        """Copies `sources[i]` into buffer i for each i in `which` in one `_foreach_copy_` call
        (the GIL is released once for all tensors)."""
        if not which:
            return
        targets, origins = [self.buffers[i] for i in which], [sources[i] for i in which]
        try:
            torch._foreach_copy_(targets, origins)
        except (RuntimeError, TypeError):  # mixed devices or an op this build lacks
            for target, origin in zip(targets, origins, strict=True):
                target.copy_(origin)

    def copy_on_stream(self, sources: list[torch.Tensor], which: list[int], stream: Any) -> Any:
        """GPU: queues the device-to-host copies on `stream`; returns the event marking their
        end."""
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for i in which:
                self.buffers[i].copy_(sources[i], non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        return event
