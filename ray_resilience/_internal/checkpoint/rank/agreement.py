"""Collectives that keep the ranks' load decisions identical, on a CPU (gloo) group when the
default group is not gloo; local for a single rank. Saves use no collective (`rounds.py`).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

_UNSET = object()


class Agreement:
    """Agreement among the `world_size` ranks of the current process group."""

    def __init__(self, *, rank: int, world_size: int, timeout_s: float) -> None:
        self.rank, self.world_size, self._timeout_s = rank, world_size, timeout_s
        self._group: Any = _UNSET
        self._group_owner: Any = None

    def _distributed(self) -> bool:
        if dist.is_available() and dist.is_initialized():
            if dist.get_world_size() != self.world_size or dist.get_rank() != self.rank:
                raise RuntimeError(
                    f"checkpointer built for rank {self.rank}/{self.world_size} runs in a process "
                    f"group of rank {dist.get_rank()}/{dist.get_world_size()}; build a new "
                    "RankCheckpointer after the world changes")
            return True
        if self.world_size > 1:
            raise RuntimeError(f"checkpointing with world_size={self.world_size} needs an "
                               "initialized torch.distributed process group")
        return False

    def group(self) -> Any:
        """The CPU group for checkpoint collectives (rebuilt when the default group changes)."""
        default = dist.distributed_c10d._get_default_group()
        if self._group is not _UNSET and self._group_owner is default:
            return self._group
        backend = str(dist.get_backend(default))
        if backend == "gloo" or "cpu:gloo" in backend:  # CPU tensors already go to gloo
            self._group = None
        else:
            timeout = datetime.timedelta(seconds=self._timeout_s)
            self._group = dist.new_group(backend="gloo", timeout=timeout)
        self._group_owner = default
        return self._group

    def sum(self, values: list[int]) -> list[int]:
        """Element-wise sum over ranks."""
        if not self._distributed():
            return list(values)
        tensor = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group())
        return [int(v) for v in tensor.tolist()]

    def all_true(self, flag: bool) -> bool:
        return self.sum([0 if flag else 1])[0] == 0

    def gather(self, obj: Any) -> list[Any]:
        """`obj` from every rank, in rank order (our own picklable plan keys only)."""
        if not self._distributed():
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group())
        return out

    def new_session(self, begin: Callable[[], str]) -> str:
        """A new session id, the same on every rank: rank 0 gets it from `begin()`."""
        token = begin() if self.rank == 0 else ""
        if not self._distributed():
            return token
        box = [token]
        dist.broadcast_object_list(box, src=0, group=self.group())
        return str(box[0])
