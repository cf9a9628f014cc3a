"""Fire-and-forget calls that a sender still accounts for: which of them the receiver has not
finished, so the sender can wait for them before its end (nothing sent is lost to a teardown)."""

from __future__ import annotations

from typing import Any

import ray
from ray.exceptions import ActorUnschedulableError, RayActorError

ACTOR_GONE = (RayActorError, ActorUnschedulableError)
"""What a call raises when its actor is gone: it died, or it was pinned to a node that no longer
exists (a writer or node agent of a lost node: Ray cannot place it again and says
ActorUnschedulableError, which is not a RayActorError)."""


def unfinished(refs: list[Any]) -> list[Any]:
    """The calls of `refs` (their result refs) the receiver has not finished; one that failed is
    finished. Anything but an ObjectRef (a test double's return) counts as finished."""
    refs = [r for r in refs if isinstance(r, ray.ObjectRef)]
    if not refs:
        return []
    _, pending = ray.wait(refs, num_returns=len(refs), timeout=0)
    return pending


def wait_finished(refs: list[Any], timeout_s: float) -> None:
    """Waits up to `timeout_s` until the receiver has finished every call of `refs`."""
    pending = unfinished(refs)
    if pending:
        ray.wait(pending, num_returns=len(pending), timeout=timeout_s)
