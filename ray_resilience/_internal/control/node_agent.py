"""`NodeAgent`: one small actor per node hosting ranks. The ranks' side threads send it their
heartbeats; it forwards one `ProgressBatch` per interval to the supervisor, so the supervisor's
message rate grows with nodes, not ranks. A rank's death still reaches the supervisor straight
from Ray (its run future); the agent carries liveness and progress only.

Nothing forwarded is lost to a run's end: `take()` (the supervisor's drain before it closes an
attempt or the run) returns only after the supervisor has folded every batch this agent sent
before, so a batch cannot arrive after the drain that should have found it.

Ray restarts a dead agent in place (same handle, `max_restarts=-1`); the new one tells the
supervisor, which gives that node's ranks a fresh heartbeat allowance instead of declaring them
lost. Reports buffered in the dead agent (at most one interval's) are gone.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ray_resilience._internal.calls import unfinished, wait_finished
from ray_resilience._internal.constants import checkpoint_call_timeout_s
from ray_resilience._internal.control.batch import ProgressFolder
from ray_resilience._internal.control.votes import VoteGatherer

log = logging.getLogger(__name__)

AGENT_NAME_PREFIX = "ray_resilience:agent:"
"""Agents are named actors (`<prefix><node id>:<unique>`), so operators and tests find them."""
AGENT_MAX_CONCURRENCY = 64
"""Threaded: heartbeats from the node's ranks are handled while the forwarder sends."""
MAX_BATCHES_PER_S = 200.0
"""Batches per second into the supervisor, all agents together: past 200 x progress_interval_s
nodes (50 at the default) each agent forwards less often than its ranks beat, so the
supervisor's load stops growing with nodes. A batch costs the supervisor ~1-2 ms of CPU on the
2-core benchmark machine (mostly Ray's task execution; the fold itself ~0.1 ms): at 4,128
simulated ranks the supervisor used 43% of a core in all (docs/benchmarks.md). Beats carry their
age, so the longer forwarding interval does not delay detection."""

TAKE_FLUSH_TIMEOUT_S = 1.5
"""How long `take()` waits for the batches already forwarded to be folded: inside the
supervisor's own drain timeout (AGENT_DRAIN_TIMEOUT_S, 2 s), so a stuck one costs the batch, not
the drain."""


def forward_interval_s(progress_interval_s: float, num_nodes: int) -> float:
    """How often each of `num_nodes` agents forwards its batch."""
    return max(progress_interval_s, num_nodes / MAX_BATCHES_PER_S)


class NodeAgent:
    """Collects its node's heartbeats and forwards them as one batch per interval."""

    def __init__(self, supervisor: Any, node: str, interval_s: float) -> None:
        self._supervisor, self.node, self._interval_s = supervisor, node, interval_s
        self._folder = ProgressFolder(node)
        self._votes = VoteGatherer()
        self._stop = threading.Event()
        self._forward_lock = threading.Lock()
        self._in_flight: list[Any] = []
        self.sent = 0
        self._source = uuid.uuid4().hex[:12]
        """Names this agent process's batches, numbered from 1 (`BatchOrder`); a restarted
        agent starts a new sequence."""
        restarted = _was_restarted()
        self._thread = threading.Thread(target=self._loop, name="rr-node-agent", daemon=True)
        self._thread.start()
        if restarted:
            log.warning("node agent on %s restarted; reports it had buffered are lost", node)
            supervisor.agent_restarted.remote(node)

    def heartbeat(self, rank: int, attempt: int, step: int | None, step_time: float | None,
                  metrics: list[dict[str, Any]], saves: list, sent_at: float,
                  events: list[dict[str, Any]], activity: int | None = None) -> None:
        """A rank's periodic progress (same arguments as `Supervisor.heartbeat`)."""
        self._votes.seen(rank, attempt)
        self._folder.add(rank, attempt, step, step_time, metrics, saves, sent_at, events,
                         activity)

    def vote(self, coordinator: Any, session: str, step: int, rank: int, ready: bool,
             plan_id: str, keys: Any, wait_s: float, world_size: int | None = None) -> Any:
        """A rank's vote in a save round (`CommitCoordinator.vote`'s arguments), sent with the
        node's other votes of that round in one `vote_many`; returns this rank's outcome."""
        return self._votes.vote(coordinator, session, step, rank, ready, plan_id, keys, wait_s,
                                checkpoint_call_timeout_s(), world_size)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.forward()

    def forward(self) -> None:
        with self._forward_lock:
            batch = self._numbered(self._folder.take())
            if not batch:
                return
            try:
                ref = self._supervisor.progress.remote(batch)
            except Exception:  # noqa: BLE001 - supervisor gone: the run is being torn down
                return
            self.sent += 1
            self._in_flight = [*unfinished(self._in_flight), ref]

    def take(self) -> Any:
        """What is buffered, to the caller instead of the supervisor (the supervisor drains the
        agents before it closes an attempt or the run), once the supervisor has folded the
        batches sent before (waiting at most TAKE_FLUSH_TIMEOUT_S for them)."""
        with self._forward_lock:
            in_flight, self._in_flight = self._in_flight, []
            batch = self._numbered(self._folder.take())
            if batch:
                self.sent += 1
        wait_finished(in_flight, TAKE_FLUSH_TIMEOUT_S)
        return batch

    def _numbered(self, batch: Any) -> Any:
        """`batch` with the next number of this agent's sequence (under the forward lock)."""
        if batch:
            batch.source, batch.seq = self._source, self.sent + 1
        return batch

    def ping(self) -> int:
        """This agent's pid (tests kill it)."""
        return os.getpid()

    def stop(self) -> None:
        """Forwards what is left and stops (the run is ending)."""
        self._stop.set()
        self._thread.join(timeout=5.0)
        self.forward()


def _was_restarted() -> bool:
    try:
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)
    except Exception:  # noqa: BLE001 - not inside an actor (unit tests, the benchmark)
        return False


def start_agent(supervisor: Any, node: str, interval_s: float) -> Any:
    """An agent pinned to `node` (hard: it exists to serve that node's ranks); no CPU reserved."""
    return ray.remote(NodeAgent).options(
        name=f"{AGENT_NAME_PREFIX}{node}:{uuid.uuid4().hex[:8]}",
        num_cpus=0, max_concurrency=AGENT_MAX_CONCURRENCY, max_restarts=-1, max_task_retries=-1,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
    ).remote(supervisor, node, interval_s)
