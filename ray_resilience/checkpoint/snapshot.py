"""The rank's state as DCP items, and reusable host buffers that snapshot it.

Called on the training thread. Building the state dict and flattening it costs a few ms; the DCP
plan (which item lives where) is rebuilt only when the state's structure changes. The snapshot is
a copy of the rank's own shards (DTensor local tensors) into buffers allocated once: pinned
host memory with a non-blocking device-to-host copy on GPU (ordered before later kernels on the
same stream), a plain memcpy on CPU. After `fill` returns, the optimizer may change the live
tensors: the buffers keep the values of the save.
"""

from __future__ import annotations

import copy
import dataclasses
import io
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.planner import WriteItem
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.distributed.tensor import DTensor

from ray_resilience.checkpoint.types import is_tensor_item, item_nbytes

MODEL_KEY, OPTIMIZER_KEY = "model", "optimizer"


def state_dict_of(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """The (sharded) state dict saved and loaded: {"model": ..., "optimizer": ...}."""
    state = {MODEL_KEY: get_model_state_dict(model)}
    if optimizer is not None:
        state[OPTIMIZER_KEY] = get_optimizer_state_dict(model, optimizer)
    return state


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

    def sources(self, items: list[WriteItem], blob_cache: dict[str, tuple[Any, bytes]] | None = None,
                ) -> tuple[list[torch.Tensor], list[bytes]]:
        """The live local tensors of the tensor items, and the serialized byte items (reused
        from `blob_cache` while a value is unchanged: torch.save of each costs ~0.2 ms)."""
        tensors, blobs = [], []
        cache = {} if blob_cache is None else blob_cache
        for item in items:
            if is_tensor_item(item):
                tensors.append(self.planner.resolve_data(item).detach())
                continue
            value = self.planner.lookup_object(item.index)
            cached = cache.get(item.index.fqn)
            if cached is None or type(cached[0]) is not type(value) or not _same(cached[0], value):
                buffer = io.BytesIO()
                torch.save(value, buffer)
                cached = cache[item.index.fqn] = (copy.deepcopy(value), buffer.getvalue())
            blobs.append(cached[1])
        return tensors, blobs


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
    """One set of host buffers, one per tensor item, reused across saves."""

    def __init__(self, items: list[WriteItem], sources: list[torch.Tensor]) -> None:
        tensor_items = [i for i in items if is_tensor_item(i)]
        self.key = tuple((tuple(i.tensor_data.chunk.sizes), i.tensor_data.properties.dtype)
                         for i in tensor_items)
        self._event: Any = None
        self.buffers = [
            torch.empty(tuple(item.tensor_data.chunk.sizes), dtype=item.tensor_data.properties.dtype,
                        pin_memory=src.is_cuda)
            for item, src in zip(tensor_items, sources, strict=True)]
        self.arrays: list[np.ndarray] = [
            b.reshape(-1).view(torch.uint8).numpy() if b.numel() else np.empty(0, np.uint8)
            for b in self.buffers]
        self.nbytes = sum(item_nbytes(i) for i in tensor_items)

    def matches(self, items: list[WriteItem]) -> bool:
        key = tuple((tuple(i.tensor_data.chunk.sizes), i.tensor_data.properties.dtype)
                    for i in items if is_tensor_item(i))
        return key == self.key

    def fill(self, sources: list[torch.Tensor]) -> None:
        """Copies the live tensors in. On GPU the copies are queued on the current stream and
        an event marks their completion; `wait_ready` waits for it (off the training thread)."""
        on_gpu = False
        for buf, src in zip(self.buffers, sources, strict=True):
            if src.is_cuda:
                on_gpu = True
                buf.copy_(src, non_blocking=True)
            else:
                buf.copy_(src)
        if on_gpu:
            self._event = torch.cuda.Event()
            self._event.record()

    def wait_ready(self) -> None:
        if self._event is not None:
            self._event.synchronize()
            self._event = None
