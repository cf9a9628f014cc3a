"""The Ray calls the supervisor makes on its ranks: waits on run calls, their outcomes, interrupts,
health checks and preemption stops. Mixed into `WorkerGroup`; a dummy group in unit tests has
the same methods."""

from __future__ import annotations

import logging
import time
from typing import Any

import ray

from ray_resilience._internal.attempt import AttemptOutcome, RankLost
from ray_resilience.errors import WorkerError

log = logging.getLogger(__name__)


class RankCalls:
    """Calls on `actors` (one per rank); `info` holds each rank's node id."""

    actors: list[Any]
    info: list[dict[str, Any]]
    attempt: int = 0
    """The attempt the run futures in flight belong to (set by `launch`)."""

    def wait(self, refs: list[Any], timeout_s: float, *, num_returns: int = 1) -> list[Any]:
        """The refs (run futures, health answers) done once `num_returns` are, or at the timeout."""
        if not refs:
            return []
        ready, _ = ray.wait(refs, num_returns=min(num_returns, len(refs)), timeout=timeout_s)
        return ready

    def outcome(self, ref: Any, rank: int) -> AttemptOutcome | RankLost:
        """What a done run future of `rank` returned, or how its actor was lost. A run call that
        raised (outside the train function) or an outcome that does not unpickle here is that
        rank's failure, like an exception in its train function."""
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            return RankLost(rank=rank, node_lost=self._node_dead(rank), detail=str(exc))
        except ray.exceptions.RayError as exc:  # RayTaskError, RaySystemError (unpickling)
            log.warning("rank %d's run call failed: %s", rank, exc)
            cause = getattr(exc, "cause", None) or exc
            error = WorkerError(ranks=[rank], attempt=self.attempt,
                                exc_type=type(cause).__name__, message=str(cause),
                                traceback=getattr(exc, "traceback_str", "") or str(exc))
            return AttemptOutcome(rank=rank, attempt=self.attempt, status="failed", error=error,
                                  failed_at=time.time())

    def _node_dead(self, rank: int) -> bool:
        """Whether the GCS lists the node `rank` ran on as dead (a lost node, not a process)."""
        node = self.info[rank]["node_id"] if rank < len(self.info) else None
        try:
            return any(n["NodeID"] == node and not n["Alive"] for n in ray.nodes())
        except Exception:  # the GCS is unreachable: report what is certain
            log.warning("could not ask the GCS whether node %s is alive", node, exc_info=True)
            return False

    def interrupt(self, ranks: list[int], attempt: int,
                  stacks_after_s: float | None = None) -> None:
        """Asks `ranks` to abort their collectives and unwind `attempt` (fire and forget); one
        still unwinding after `stacks_after_s` writes its threads' stacks to its worker log."""
        for rank in ranks:
            self.actors[rank].interrupt.remote(attempt, stacks_after_s)

    def health(self, ranks: list[int], timeout_s: float) -> dict[int, str]:
        """Ranks among `ranks` that are unhealthy (CUDA on GPU) or did not answer, with why."""
        refs = {self.actors[r].health.remote(): r for r in ranks}
        ready = set(self.wait(list(refs), timeout_s, num_returns=len(refs)))
        unhealthy = {rank: "no answer to the health check" for ref, rank in refs.items()
                     if ref not in ready}
        for ref in ready:
            try:
                reason = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                reason = f"actor died: {exc}"
            if reason is not None:
                unhealthy[refs[ref]] = reason
        return unhealthy

    def available_resources(self) -> dict[str, float]:
        return ray.available_resources()

    def stop_at(self, ranks: list[int], attempt: int, step: int, deadline: float) -> None:
        """Asks `ranks` to save `step`, wait until it is durable (by `deadline`, wall time) and
        leave their train function (fire and forget)."""
        for rank in ranks:
            self.actors[rank].stop_at.remote(attempt, step, deadline)

    def draining_nodes(self) -> dict[str, float]:
        """Nodes being drained (SIGTERM to their `ray start`, the autoscaler, `ray drain-node`)
        -> the drain's deadline in wall seconds (0: none). Read from the GCS."""
        try:
            draining = ray._private.state.state.get_draining_nodes()  # no public API in Ray 2.60
        except Exception as exc:  # noqa: BLE001 - a GCS hiccup: ask again next time
            log.debug("could not read the draining nodes: %s", exc)
            return {}
        return {node: ms / 1000.0 for node, ms in draining.items()}
