"""The ranks' actors in their placement-group bundles: create, launch attempts, kill, replace,
tear down.

Every Ray call the supervisor makes on its ranks goes through `WorkerGroup` (see `RankCalls`), so
the supervisor's state machine runs unchanged on a dummy group in unit tests.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from ray_resilience._internal.attempt import AttemptSpec
from ray_resilience._internal.calls import ACTOR_GONE
from ray_resilience._internal.constants import (
    DEFAULT_SLOW_WAIT_WARNING_S,
    SLOW_WAIT_WARNING_ENV_VAR,
    WORKER_MAX_CONCURRENCY,
    env_float,
)
from ray_resilience._internal.control.node_agent import forward_interval_s, start_agent
from ray_resilience._internal.priority import rank_niceness
from ray_resilience._internal.rank import preimport
from ray_resilience._internal.rank.actor import WorkerActor
from ray_resilience._internal.worker_group import startup
from ray_resilience._internal.worker_group.bundles import Bundle, Bundles
from ray_resilience._internal.worker_group.prestart import WorkerPrestarter
from ray_resilience._internal.worker_group.rank_calls import RankCalls
from ray_resilience.config import ScalingConfig

log = logging.getLogger(__name__)

AGENT_DRAIN_TIMEOUT_S = 2.0
"""How long the supervisor waits for the node agents' buffered reports."""
PLACED_POLL_S = 0.2
"""While replacement actors start, how often `replace` asks Ray where their bundles went."""


class WorkerGroup(RankCalls):
    """Owns the ranks' bundles (see `bundles.py`) and one actor per rank."""

    def __init__(self, scaling: ScalingConfig, train_fn: bytes, train_config: Any,
                 supervisor: Any, env_vars: dict[str, str], num_spares: int = 0,
                 num_prestarted: int = 0) -> None:
        self.scaling, self.num_spares = scaling, num_spares
        self._train_fn, self._train_config = train_fn, train_config
        self._supervisor, self._env_vars = supervisor, env_vars
        self.bundles = Bundles(scaling)
        self.actors: list[Any] = []
        self.info: list[dict[str, Any]] = []
        self.bundle_of: list[Bundle] = []
        """The bundle hosting each rank (a spare that took over keeps its own)."""
        self.spares: list[tuple[Any, Bundle, Any]] = []
        """Warm spare actors: (actor, bundle, pending info() ref)."""
        self._spare_bundles: list[Bundle] = []
        """Bundles spares left by taking over ranks, until `replenish_spares` fills them."""
        self._reserved: list[Bundle] = []
        self.prestarter = WorkerPrestarter(num_prestarted)
        self.preimport_key = f"preimport-{uuid.uuid4().hex}"
        """The run's switch for the rank processes' background import (`preimport`)."""
        self._rank_env = {**preimport.rank_env_vars(env_vars, self.preimport_key),
                          **rank_niceness()}
        self._rank_runtime_env: str | None = None
        """The ranks' runtime env as the raylet serialized it: prestarted workers are asked for
        with it, so only rank actors take them."""
        self._preimport_on = False
        self._prestart_nodes: dict[str, int] = {}
        """Node -> prestarted workers to ask for at the next request."""
        self.agents: dict[str, Any] = {}
        """Node -> its `NodeAgent`, which batches the heartbeats of the ranks there."""

    @property
    def world_size(self) -> int:
        """Current number of ranks (below num_workers after a shrink)."""
        return len(self.actors) if self.actors else self.scaling.num_workers

    def reserve(self, placement_timeout_s: float) -> None:
        """Creates the placement group (ranks plus spares) and waits until it is placed."""
        self._reserved = self.bundles.reserve(self.world_size + self.num_spares,
                                              placement_timeout_s)

    def bundle_nodes(self) -> list[str]:
        """Node id of each rank's bundle, known once `reserve` returned (before any actor)."""
        return [self.bundles.node_of(b) for b in self._reserved[:self.world_size]]

    def spawn(self) -> None:
        """One actor per rank (and the warm spares) in the reserved bundles; returns once every
        rank answered (their imports continue in `prewarm`)."""
        world = self.world_size
        self.bundle_of = list(self._reserved[:world])
        self.actors = [self._new_actor(b) for b in self.bundle_of]
        for actor in self.actors:  # imports done before any attempt can be interrupted
            actor.prewarm.remote()
        for bundle in self._reserved[world:]:
            self._add_spare(bundle)
        refs = [a.info.remote() for a in self.actors]
        self.info = [self._started(rank, ref) for rank, ref in enumerate(refs)]
        failed = startup.first_failure(self.info)
        if failed is not None:  # the user's error (e.g. their module is missing on the ranks)
            raise failed
        self._rank_runtime_env = self.info[0].get("runtime_env") if self.info else None

    def _started(self, rank: int, info_ref: Any) -> dict[str, Any]:
        """A new rank's `info()`; a WorkerStartupError when Ray could not create its actor."""
        try:
            return ray.get(info_ref, timeout=120)
        except ray.exceptions.RayActorError as exc:
            raise startup.from_actor_error(rank, self.bundles.node_of(self.bundle_of[rank]),
                                           exc) from None

    @property
    def spares_pending(self) -> bool:
        """Whether spares used by a recovery still wait to be replaced (`replenish_spares`)."""
        return bool(self._spare_bundles)

    def replenish_spares(self, exclude: set[str]) -> None:
        """Starts a spare in each bundle a spare left (none on an excluded node). Called once the
        recovery has a completed step: a starting spare's imports would take its CPU."""
        bundles, self._spare_bundles = self._spare_bundles, []
        for bundle in bundles:
            if self.bundles.node_of(bundle) not in exclude:
                self._add_spare(bundle)

    def _add_spare(self, bundle: Bundle) -> None:
        actor = self._new_actor(bundle, spare=True)
        actor.prewarm.remote()
        self.spares.append((actor, bundle, actor.info.remote()))

    @property
    def prestart_pending(self) -> bool:
        return self.prestarter.enabled and bool(self._prestart_nodes)

    def prestart(self) -> list[str]:
        """Asks the nodes where actors were created since the last call for idle workers;
        returns the nodes asked. The supervisor decides when (`BackgroundImports.upkeep`)."""
        nodes, self._prestart_nodes = self._prestart_nodes, {}
        if not nodes or not self.prestarter.enabled:
            return []
        if self._rank_runtime_env is None:  # Ray's internals moved: no rank would take them
            log.info("not prestarting workers: the ranks' runtime env is unknown")
            self.prestarter.enabled = False
            return []
        if not self._preimport_on:
            self._preimport_on = preimport.switch(self.preimport_key, True)
        return self.prestarter.request(nodes, self._rank_runtime_env)

    def _new_actor(self, bundle: Bundle, *, spare: bool = False) -> Any:
        """A rank's actor in `bundle`. Ranks carry the pre-import setup hook; warm spares do not
        (they start with the run and import at normal priority)."""
        node = self.bundles.node_of(bundle)
        if node is not None and not spare:
            first = not self.info  # before the run's first ranks answered
            self._prestart_nodes[node] = self.prestarter.count if first \
                else self._prestart_nodes.get(node, 0) + 1
        scaling = self.scaling.bundle
        options: dict[str, Any] = {
            "num_cpus": scaling.get("CPU", 0), "num_gpus": scaling.get("GPU", 0),
            "resources": {k: v for k, v in scaling.items() if k not in ("CPU", "GPU")},
            "max_concurrency": WORKER_MAX_CONCURRENCY,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=bundle.pg, placement_group_bundle_index=bundle.index),
        }
        env = {**self._env_vars, **rank_niceness()} if spare else self._rank_env
        options["runtime_env"] = {"env_vars": env}
        return ray.remote(WorkerActor).options(**options).remote(
            self._train_fn, self._train_config, self._supervisor)

    def layout(self) -> tuple[list[int], list[int], list[int]]:
        """(local_rank, local_world_size, node_rank) per rank, from where each actor landed."""
        node_order: list[str] = []
        for item in self.info:
            if item["node_id"] not in node_order:
                node_order.append(item["node_id"])
        local_rank, counts = [], dict.fromkeys(node_order, 0)
        for item in self.info:
            local_rank.append(counts[item["node_id"]])
            counts[item["node_id"]] += 1
        local_size = [counts[item["node_id"]] for item in self.info]
        node_rank = [node_order.index(item["node_id"]) for item in self.info]
        return local_rank, local_size, node_rank

    def master(self) -> tuple[str, int]:
        """Address and a free port on rank 0's node for a new rendezvous."""
        return self.info[0]["ip"], ray.get(self.actors[0].free_port.remote(), timeout=60)

    def launch(self, specs: list[AttemptSpec]) -> dict[Any, int]:
        """Starts one attempt on every rank; returns {run future: rank}."""
        self.attempt = specs[0].attempt if specs else self.attempt
        return {self.actors[s.rank].run_attempt.remote(s): s.rank for s in specs}

    def node_ids(self) -> list[str]:
        return [item["node_id"] for item in self.info]

    def progress_sinks(self, interval_s: float) -> list[Any]:
        """Per rank, the agent of its node (started for nodes that have none yet)."""
        forward_s = forward_interval_s(interval_s, len(set(self.node_ids())))
        for node in self.node_ids():
            if node not in self.agents:
                self.agents[node] = start_agent(self._supervisor, node, forward_s)
        return [self.agents[node] for node in self.node_ids()]

    def drain_progress(self) -> list[Any]:
        """The batches the agents hold now (an agent that does not answer is skipped). Agents of
        nodes that no longer host a rank (a lost node) are stopped first."""
        hosting = set(self.node_ids())
        for node in [n for n in self.agents if n not in hosting]:
            kill_quietly(self.agents.pop(node))
        refs = {agent.take.remote(): node for node, agent in self.agents.items()}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=AGENT_DRAIN_TIMEOUT_S)
        batches = []
        for ref in ready:
            try:
                batches.append(ray.get(ref))
            except ACTOR_GONE:  # its node is gone, and the batch with it
                self.agents.pop(refs[ref], None)
        return batches

    def pids(self) -> list[int]:
        return [item["pid"] for item in self.info]

    def shutdown(self, timeout_s: float) -> None:
        """Asks ranks to release resources, then kills the actors and removes the group."""
        everyone = self.actors + [spare for spare, _, _ in self.spares]
        if everyone:
            refs = [a.shutdown.remote() for a in everyone]
            ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
            for actor in everyone:
                ray.kill(actor, no_restart=True)
        for agent in self.agents.values():
            kill_quietly(agent)
        self.actors, self.spares, self.agents = [], [], {}
        self.bundles.remove_all()
        if self._preimport_on:
            self._preimport_on = not preimport.switch(self.preimport_key, False)


    def kill(self, rank: int) -> None:
        """Kills one rank's actor (SIGKILL through Ray); its bundle is freed for a replacement."""
        kill_quietly(self.actors[rank])

    def node_of_rank(self, rank: int) -> str | None:
        """The node of the bundle hosting `rank` now."""
        return self.bundles.node_of(self.bundle_of[rank])

    def replace(self, ranks: list[int], timeout_s: float, exclude: set[str] | None = None,
                on_node: Callable[[str], None] | None = None) -> list[int]:
        """New actors for `ranks` (a warm spare first, else a new actor in the rank's bundle;
        ranks on an `exclude` node move). Returns the ranks not replaced within `timeout_s`.
        `on_node`: called with each node a new actor lands on that its rank did not run on, as
        soon as Ray places its bundle there, while the actor is still starting (the run's
        writers for that node start beside it instead of after it)."""
        exclude = exclude or set()
        unplaced = self._move_off(ranks, exclude, timeout_s)
        refs: dict[Any, int] = {}
        moving: dict[int, str | None] = {}
        """Ranks whose new actor's node is yet to be announced -> the node they ran on."""
        for rank in [r for r in ranks if r not in unplaced]:
            freed = self.bundle_of[rank]
            if self.spares:  # a warm spare takes over; a new spare will start in the freed bundle
                actor, bundle, info_ref = self.spares.pop(0)
                self.actors[rank], self.bundle_of[rank] = actor, bundle
                refs[info_ref] = rank
                self._spare_bundles.append(freed)
            else:
                self._start_in_bundle(rank, refs)
                if on_node is not None:
                    moving[rank] = self.info[rank]["node_id"] if rank < len(self.info) else None
        slow_s = env_float(SLOW_WAIT_WARNING_ENV_VAR, DEFAULT_SLOW_WAIT_WARNING_S)
        deadline = time.monotonic() + timeout_s
        warn_at = time.monotonic() + slow_s
        while refs and time.monotonic() < deadline:
            if moving:
                self._announce_nodes(moving, on_node)
            until = min(deadline, warn_at)
            if moving:  # look again soon where Ray placed them
                until = min(until, time.monotonic() + PLACED_POLL_S)
            ready, _ = ray.wait(list(refs), num_returns=len(refs),
                                timeout=max(until - time.monotonic(), 0.01))
            for ref in ready:
                rank = refs.pop(ref)
                moving.pop(rank, None)  # its answer names its node: the caller takes it there
                try:
                    self.info[rank] = ray.get(ref)
                    failed = startup.from_info(rank, self.info[rank])
                    if failed is not None:  # it cannot run the user's code there: no retry
                        raise failed
                except ray.exceptions.RayActorError as exc:
                    # Its bundle's node died before it started (the bundle is being placed
                    # again): try once more with a new actor while time remains.
                    log.warning("replacement for rank %d died before starting: %s", rank, exc)
                    self._start_in_bundle(rank, refs)
                    if on_node is not None:
                        moving[rank] = self.info[rank]["node_id"] if rank < len(self.info) \
                            else None
            if refs and time.monotonic() >= warn_at:
                log.warning("waiting for replacement ranks %s to start (available: %s)",
                            sorted(refs.values()), ray.available_resources())
                warn_at = time.monotonic() + slow_s
        missing = sorted(set(refs.values()) | set(unplaced))
        for rank in missing:
            self.kill(rank)
        return missing  # the next prestarted workers: `prestart`, when the supervisor says

    def _announce_nodes(self, moving: dict[int, str | None],
                        on_node: Callable[[str], None] | None) -> None:
        """`on_node` for each rank of `moving` whose bundle Ray placed on a node other than the
        one it ran on (a lost node's bundle is placed again once another node has room)."""
        for rank, before in list(moving.items()):
            node = self.bundles.placed_node(self.bundle_of[rank])
            if node is None or node == before:
                continue
            del moving[rank]
            if on_node is not None:
                try:
                    on_node(node)
                except Exception:  # an early start only: the repair goes on without it
                    log.warning("could not prepare node %s for rank %d", node, rank,
                                exc_info=True)

    def _start_in_bundle(self, rank: int, refs: dict[Any, int]) -> None:
        self.actors[rank] = self._new_actor(self.bundle_of[rank])
        self.actors[rank].prewarm.remote()
        refs[self.actors[rank].info.remote()] = rank

    def _move_off(self, ranks: list[int], exclude: set[str], timeout_s: float) -> list[int]:
        """Gives ranks on excluded nodes bundles elsewhere; returns those that found none."""
        for spare in [s for s in self.spares if self.bundles.node_of(s[1]) in exclude]:
            self.spares.remove(spare)
            kill_quietly(spare[0])
        moving = [r for r in ranks if self.bundles.node_of(self.bundle_of[r]) in exclude]
        if not moving:
            return []
        fresh = self.bundles.elsewhere(len(moving), exclude, timeout_s)
        if fresh is None:
            log.warning("no room for ranks %s outside the excluded nodes %s", moving,
                        sorted(exclude))
            return moving
        for rank, bundle in zip(moving, fresh, strict=True):
            self.bundle_of[rank] = bundle
        return []

    def drop(self, ranks: list[int]) -> None:
        """Removes `ranks` and shifts the ranks above each gap down (the world shrinks)."""
        for rank in sorted(ranks, reverse=True):
            self.kill(rank)
            del self.actors[rank], self.info[rank], self.bundle_of[rank]


def create_worker_group(*, scaling: ScalingConfig, train_fn: bytes, train_config: Any,
                        env_vars: dict[str, str], num_spares: int = 0,
                        num_prestarted: int = 0) -> WorkerGroup:
    """The group of the calling supervisor actor: ranks send heartbeats to its handle."""
    me = ray.get_runtime_context().current_actor
    return WorkerGroup(scaling, train_fn, train_config, me, env_vars, num_spares=num_spares,
                       num_prestarted=num_prestarted)


def kill_quietly(actor: Any) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already dead
        pass
