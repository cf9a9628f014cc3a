"""`SimGroup`: the worker group the real supervisor drives in the benchmark. Its ranks are
virtual ranks on `RankHost` actors; every Ray call the supervisor makes (one run call per rank,
waits on the run futures, interrupts, kills) is made for real, and the run futures, a rank's
death and a lost node reach the real detection code through Ray as in a run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ray

from ray_resilience._internal.attempt import AttemptOutcome, AttemptSpec, RankLost
from ray_resilience._internal.worker_group.rank_calls import RankCalls

from .host import DIED


@dataclasses.dataclass(frozen=True)
class HostSlot:
    """One rank host: its handle, its Ray node and the simulated nodes it holds."""

    handle: Any
    node_id: str
    sim_nodes: tuple[str, ...]


class SimGroup(RankCalls):
    """The `WorkerGroup` surface over virtual ranks (rank r lives on simulated node
    r // ranks_per_node)."""

    def __init__(self, hosts: list[HostSlot], ranks_per_node: int, world_size: int,
                 supervisor: Any) -> None:
        self.hosts, self.ranks_per_node, self._supervisor = hosts, ranks_per_node, supervisor
        self.spares_pending = self.prestart_pending = False
        self.actors: list[Any] = []
        self.info: list[dict[str, Any]] = []
        self._sim_node: list[str] = []
        sim_nodes = [(h, n) for h in hosts for n in h.sim_nodes]
        for rank in range(world_size):
            host, node = sim_nodes[(rank // ranks_per_node) % len(sim_nodes)]
            self._place(rank, host, node)

    def _place(self, rank: int, host: HostSlot, node: str) -> None:
        entry = {"node_id": host.node_id, "pid": 0, "sim_node": node}
        if rank < len(self.actors):
            self.actors[rank], self.info[rank], self._sim_node[rank] = host.handle, entry, node
        else:
            self.actors.append(host.handle)
            self.info.append(entry)
            self._sim_node.append(node)

    @property
    def world_size(self) -> int:
        return len(self.actors)

    def reserve(self, timeout_s: float) -> None: ...
    def prestart(self) -> None: ...
    def replenish_spares(self, exclude: set[str]) -> None: ...

    def spawn(self) -> None:
        by_host: dict[Any, dict[str, list[int]]] = {}
        for rank, handle in enumerate(self.actors):
            by_host.setdefault(handle, {}).setdefault(self._sim_node[rank], []).append(rank)
        nodes_total = len(set(self._sim_node))
        pids = ray.get([h.assign.remote(self._supervisor, nodes, nodes_total)
                        for h, nodes in by_host.items()], timeout=120)
        pid_of = dict(zip(by_host, pids, strict=True))
        for rank, handle in enumerate(self.actors):
            self.info[rank]["pid"] = pid_of[handle]

    def bundle_nodes(self) -> list[str]:
        return [i["node_id"] for i in self.info]

    def master(self) -> tuple[str, int]:
        return "127.0.0.1", 0

    def layout(self) -> tuple[list[int], list[int], list[int]]:
        n = self.world_size
        per = self.ranks_per_node
        return [r % per for r in range(n)], [per] * n, [r // per for r in range(n)]

    def launch(self, specs: list[AttemptSpec]) -> dict[Any, int]:
        return {self.actors[s.rank].run_rank.remote(s.rank, s.attempt, s.resume_hint): s.rank
                for s in specs}

    def progress_sinks(self, interval_s: float) -> list[None]:
        return [None] * self.world_size  # the hosts hand heartbeats to their in-process agents

    def drain_progress(self) -> list[Any]:
        live = [h.handle for h in self.hosts if h.handle in self.actors]
        ready, _ = ray.wait([h.take_all.remote() for h in live], num_returns=len(live),
                            timeout=2.0)
        out = []
        for ref in ready:
            try:
                out.extend(ray.get(ref))
            except ray.exceptions.RayActorError:
                continue
        return out

    def outcome(self, ref: Any, rank: int) -> AttemptOutcome | RankLost:
        result = super().outcome(ref, rank)
        if result == DIED:
            return RankLost(rank=rank, node_lost=False, detail="virtual rank died")
        return result

    def interrupt(self, ranks: list[int], attempt: int) -> None:
        for handle, group in self._by_host(ranks).items():
            handle.end.remote(group, "interrupted")

    def kill(self, rank: int) -> None:
        self.actors[rank].end.remote([rank], "killed")

    def health(self, ranks: list[int], timeout_s: float) -> dict[int, str]:
        return {}

    def replace(self, ranks: list[int], timeout_s: float,
                exclude: set[str] | None = None) -> list[int]:
        """Ranks whose host does not answer (its node is lost, whether or not Ray has declared it
        dead yet) move to the first live host, on a new simulated node."""
        gone = {h.node_id for h in self.hosts if not _answers(h.handle)}
        live = [h for h in self.hosts if h.node_id not in gone]
        for rank in ranks:
            if self.info[rank]["node_id"] in gone:
                node = f"moved-{self._sim_node[rank]}"
                self._place(rank, live[0], node)
                ray.get(live[0].handle.assign.remote(self._supervisor, {node: [rank]},
                                                     len(set(self._sim_node))), timeout=60)
        return []

    def drop(self, ranks: list[int]) -> None:
        raise NotImplementedError("the benchmark never shrinks the world")

    def available_resources(self) -> dict[str, float]:
        return ray.available_resources()

    def node_of_rank(self, rank: int) -> str:
        return self.info[rank]["node_id"]

    def node_ids(self) -> list[str]:
        return [i["node_id"] for i in self.info]

    def pids(self) -> list[int]:
        return [i["pid"] for i in self.info]

    def shutdown(self, timeout_s: float) -> None:
        for handle, group in self._by_host(list(range(self.world_size))).items():
            handle.end.remote(group, "interrupted")

    def _by_host(self, ranks: list[int]) -> dict[Any, list[int]]:
        out: dict[Any, list[int]] = {}
        for rank in ranks:
            out.setdefault(self.actors[rank], []).append(rank)
        return out


def _answers(handle: Any) -> bool:
    try:
        ray.get(handle.stats.remote(), timeout=2.0)
        return True
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return False


def sim_group_factory(hosts: list[HostSlot], ranks_per_node: int) -> Any:
    """A `worker_group_factory` for the supervisor (keywords as `create_worker_group`'s)."""

    def factory(*, scaling: Any, **_: Any) -> SimGroup:
        me = ray.get_runtime_context().current_actor
        return SimGroup(hosts, ranks_per_node, scaling.num_workers, me)

    return factory
