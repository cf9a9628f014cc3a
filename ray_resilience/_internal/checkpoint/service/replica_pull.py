"""Pulling a replica from another writer's memory at a set pace: the shard's layout, then its
tensor bytes in chunks, one in flight at a time, sleeping as needed to stay at or under
`CheckpointConfig.replica_bytes_per_s`, so a copy of GBs never bursts over the network and
memory bandwidth training needs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import ray

from ray_resilience._internal.checkpoint.wire import ShardPayload
from ray_resilience._internal.constants import (
    DEFAULT_REPLICA_CHUNK_BYTES,
    DEFAULT_REPLICA_GET_TIMEOUT_S,
    REPLICA_CHUNK_BYTES_ENV_VAR,
    REPLICA_GET_TIMEOUT_ENV_VAR,
    env_float,
)


class Pacer:
    """Sleeps so that the bytes reported through `sent` arrive at `rate` bytes/s at most."""

    def __init__(self, rate: float | None) -> None:
        self.rate, self.total, self.slept_s = rate, 0, 0.0
        self._t0 = time.monotonic()

    def sent(self, nbytes: int) -> None:
        self.total += nbytes
        if not self.rate:
            return
        ahead = self.total / self.rate - (time.monotonic() - self._t0)
        if ahead > 0:
            time.sleep(ahead)
            self.slept_s += ahead


def pull_replica(source: Any, rank: int, session: str, step: int, *, rate: float | None,
                 allocate: Callable[[int], np.ndarray] | None = None) -> ShardPayload | None:
    """`rank`'s shard of (session, step) from writer `source` (its `replica_part`), its tensor
    bytes in `allocate(length)` (a new array by default); None when the source no longer holds
    it."""
    chunk = max(1, int(env_float(REPLICA_CHUNK_BYTES_ENV_VAR, DEFAULT_REPLICA_CHUNK_BYTES)))
    timeout = env_float(REPLICA_GET_TIMEOUT_ENV_VAR, DEFAULT_REPLICA_GET_TIMEOUT_S)
    layout = ray.get(source.replica_part.remote(rank, session, step, None), timeout=timeout)
    if layout is None:
        return None
    spans, blobs, extra, length = layout
    data = np.empty(length, np.uint8) if allocate is None else allocate(length)
    pacer = Pacer(rate)
    for offset in range(0, length, chunk):
        n = min(chunk, length - offset)
        part = ray.get(source.replica_part.remote(rank, session, step, offset, n),
                       timeout=timeout)
        if part is None:
            return None
        data[offset:offset + n] = part
        pacer.sent(n)
    return ShardPayload(data, spans, blobs, extra)
