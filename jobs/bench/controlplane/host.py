"""`RankHost`: an async actor holding many virtual ranks and the real `NodeAgent` of each
simulated node it hosts. A virtual rank sends what a rank's side thread sends (a heartbeat with
its step, its reports and an activity counter) at the configured interval; its run future is a
`run_rank` call that returns when the rank finishes, is interrupted, killed or dies.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from typing import Any

from ray_resilience._internal.attempt import AttemptOutcome
from ray_resilience._internal.control.node_agent import NodeAgent, forward_interval_s

DIED = "died"
"""What a virtual rank's run future returns when it died (the sim's SIGKILL)."""


@dataclasses.dataclass
class VirtualRank:
    rank: int
    node: str
    attempt: int = -1
    step: int = 0
    base: int = 0
    """The step the attempt resumed from."""
    started: float = 0.0
    frozen: bool = False
    activity: int = 0
    future: asyncio.Future | None = None


class RankHost:
    """Virtual ranks of several simulated nodes; one per Ray node of the benchmark cluster."""

    def __init__(self, interval_s: float, step_s: float) -> None:
        self._interval_s, self._step_s = interval_s, step_s
        self._report_every = 1
        self._agents: dict[str, NodeAgent] = {}
        self._ranks: dict[int, VirtualRank] = {}
        self._ticker: asyncio.Task | None = None
        self.heartbeats = 0

    async def assign(self, supervisor: Any, ranks_by_node: dict[str, list[int]],
                     num_nodes: int) -> int:
        """Creates the simulated nodes' agents and ranks (`num_nodes` in the whole world, as
        the worker group sets its agents' interval); returns this host's pid."""
        forward_s = forward_interval_s(self._interval_s, num_nodes)
        for node, ranks in ranks_by_node.items():
            if node not in self._agents:
                self._agents[node] = NodeAgent(supervisor, node, forward_s)
            for rank in ranks:
                self._ranks[rank] = VirtualRank(rank, node)
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().create_task(self._tick())
        return os.getpid()

    async def run_rank(self, rank: int, attempt: int, resume_step: int) -> Any:
        """The rank's run future for `attempt`: returns its outcome when it ends."""
        vr = self._ranks[rank]
        vr.attempt, vr.step, vr.base = attempt, resume_step, resume_step
        vr.started, vr.frozen = time.time(), False
        vr.future = asyncio.get_running_loop().create_future()
        return await vr.future

    async def end(self, ranks: list[int], how: str) -> float:
        """Ends ranks' attempts: finished, interrupted, killed or died. Returns when (wall)."""
        now = time.time()
        for rank in ranks:
            vr = self._ranks.get(rank)
            if vr is None or vr.future is None or vr.future.done():
                continue
            if how in (DIED, "killed"):
                vr.future.set_result(DIED)
            else:
                vr.future.set_result(AttemptOutcome(
                    rank=rank, attempt=vr.attempt, status=how, last_step=vr.step or None,
                    last_step_time=now))
            vr.attempt = -1
        return now

    async def set_step_s(self, step_s: float, report_every: int = 1) -> None:
        """Steps from now on take `step_s` and ranks report every `report_every` steps (the
        memory run compresses 10,000 steps; every rank reports the same steps, as a loop that
        calls `report` every k steps does)."""
        now = time.time()
        for vr in self._ranks.values():
            vr.base, vr.started = vr.step, now
        self._step_s, self._report_every = step_s, report_every

    async def freeze(self, rank: int) -> float:
        """The rank's training thread stops (a hang): heartbeats go on, steps and activity stop."""
        self._ranks[rank].frozen = True
        return time.time()

    async def move(self, rank: int, node: str) -> None:
        """The rank now lives on simulated node `node` of this host (a respawn elsewhere)."""
        self._ranks[rank] = VirtualRank(rank, node)

    async def take_all(self) -> list[Any]:
        """Every agent's buffered batch (what the supervisor's drain collects)."""
        return [b for b in (a.take() for a in self._agents.values()) if b]

    async def vote_round(self, coordinator: Any, session: str, step: int, per_node: bool,
                         wait_s: float) -> tuple[float, float, int]:
        """Every rank here votes ready in round `step`, one call per rank or per simulated node.
        Returns (first vote sent, last outcome received, ranks that learned it was claimed)."""
        by_node: dict[str, list[int]] = {}
        for vr in self._ranks.values():
            by_node.setdefault(vr.node, []).append(vr.rank)
        keys = {r: [(f"shard.{r}", 1 << 20)] for r in self._ranks}
        t0 = time.time()
        if per_node:
            calls = [coordinator.vote_many.remote(
                session, step, {r: (True, "plan", keys[r]) for r in ranks}, wait_s)
                for ranks in by_node.values()]
            results = [v for d in await asyncio.gather(*calls) for v in d.values()]
        else:
            results = await asyncio.gather(*[coordinator.vote.remote(
                session, step, r, True, "plan", keys[r], wait_s) for r in self._ranks])
        return t0, time.time(), sum(1 for r in results if r is not None and r.claimed)

    async def stats(self) -> dict[str, Any]:
        return {"heartbeats": self.heartbeats,
                "batches": sum(a.sent for a in self._agents.values())}

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            now = time.time()
            for vr in self._ranks.values():
                if vr.attempt >= 0:
                    self._beat(vr, now)

    def _beat(self, vr: VirtualRank, now: float) -> None:
        reports = []
        if not vr.frozen:
            vr.activity += 1
            target = vr.base + int((now - vr.started) / self._step_s)
            while vr.step < target:
                vr.step += 1
                if vr.step % self._report_every == 0:
                    reports.append({"loss": 1.0 / vr.step, "step": vr.step,
                                    "rank": vr.rank, "time": now})
        self._agents[vr.node].heartbeat(vr.rank, vr.attempt, vr.step or None, now, reports, [],
                                        now, [], vr.activity)
        self.heartbeats += 1
