"""One recovery, as the supervisor carries it out: tear down, respawn, new attempt.

Every rank that keeps its process is interrupted (collectives aborted, an exception raised
into its training thread) and must unwind within `InProcessConfig.interrupt_timeout_s`; ranks
that do not, and ranks whose process is gone, are killed and replaced when `InJobConfig` allows.
Each phase is timed on the supervisor's clock and recorded in the goodput timeline.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import ray
from ray.exceptions import RayActorError

from ray_resilience.errors import HangError, InsufficientResourcesError, WorkerDiedError
from ray_resilience._internal.supervisor.state import FaultEvent

log = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 10.0
"""How long a kept rank may take to answer its health check."""


class Recovery:
    """Carries out one `Decision` to restart; `execute()` returns an error if it cannot."""

    def __init__(self, sup: Any, fault: FaultEvent, decision: Any) -> None:
        self.sup, self.fault, self.decision = sup, fault, decision
        self.fault_id = fault.detail.get("fault_id") or f"fault{len(sup.faults)}-a{fault.attempt}"
        self.respawn: set[int] = set(decision.respawn)
        self._load_recorded = False

    def execute(self) -> BaseException | None:
        sup, fault = self.sup, self.fault
        timeline = sup.record.timeline
        t_fault = fault.t_fault or fault.t_detect
        timeline.fault_detected(
            self.fault_id, t_fault=t_fault, t_detect=max(fault.t_detect, t_fault),
            step_at_fault=fault.step or 0, rank=fault.ranks[0], cause=fault.cause,
            kind=fault.detail.get("kind"))
        error = self._teardown()
        if error is not None:
            return error
        t_torn = time.time()
        late = sup.record.close_attempt(sup.attempt, self.respawn)
        if late:  # steps the lost ranks had finished but not reported
            fault.step = max(fault.step or 0, late[-1])
            timeline.step_at_fault_is(self.fault_id, late[-1])
        timeline.recovery_phase(self.fault_id, "teardown", fault.t_detect, t_torn)
        if self.respawn:
            error = self._respawn()
            if error is not None:
                return error
        fault.detail["respawned"] = tuple(sorted(self.respawn))
        sup.attempt += 1
        sup.record.expect_recovery(
            sup.attempt, self.fault_id, cause=fault.cause, t_fault=t_fault, step=fault.step,
            rank=fault.ranks[0] if len(fault.ranks) == 1 else None,
            mechanism="respawn" if self.respawn else "in-process")
        sup.launch_attempt()
        t_launched = time.time()
        timeline.recovery_phase(self.fault_id, "rendezvous", t_torn, t_launched)
        log.info("[%s] attempt %d started after %s (respawned %s) in %.2f s", sup.run_name,
                 sup.attempt, fault.cause, sorted(self.respawn), t_launched - fault.t_detect)
        return None

    def _respawn(self) -> BaseException | None:
        """Replaces the ranks; those without capacity in time are dropped if the world may shrink."""
        sup, in_job = self.sup, self.sup.cfg.in_job
        for node in self.decision.exclude_nodes:
            log.warning("excluding node %s from run %s: more than InJobConfig.max_node_faults=%d "
                        "faults lost or hung a rank there; its ranks move to other nodes",
                        node, sup.run_name, in_job.max_node_faults)
            sup.excluded_nodes.add(node)
        self.fault.detail["excluded_nodes"] = sorted(self.decision.exclude_nodes)
        missing = sup.group.replace(sorted(self.respawn), in_job.replacement_timeout_s,
                                    exclude=sup.excluded_nodes)
        sup.num_respawns += 1
        started = [_replacement(rank, info) for rank, info in enumerate(sup.group.info)
                   if rank in self.respawn]
        self.fault.detail["replacements"] = started
        log.info("[%s] replacement processes: %s", sup.run_name, started)
        if missing:
            remaining = sup.group.world_size - len(missing)
            if in_job.min_workers is None or remaining < in_job.min_workers:
                return InsufficientResourcesError(
                    "InJobConfig.replacement_timeout_s", in_job.replacement_timeout_s,
                    sup._scaling.bundle, ray.available_resources(),
                    f"no capacity for replacement ranks {missing}; set InJobConfig.min_workers "
                    f"(now {in_job.min_workers}) to continue with fewer ranks, or add nodes.")
            log.warning("continuing with %d ranks: no capacity for ranks %s", remaining, missing)
            sup.shrink(missing)
        if sup.checkpoints is not None:  # new nodes get writers; dead writers are replaced
            sup.checkpoints.ensure_writers(sup.group.node_ids())
        return None

    def _teardown(self) -> BaseException | None:
        sup = self.sup
        for rank in self.respawn:
            sup.group.kill(rank)  # a stuck or dead rank is killed before it is replaced
        keep = {ref: rank for ref, rank in sup.futures.items() if rank not in self.respawn}
        for rank in keep.values():
            sup.group.actors[rank].interrupt.remote(sup.attempt)
        timeout = sup.cfg.in_process.interrupt_timeout_s if sup.cfg.in_process else 10.0
        stuck_ranks = self._wait_unwound(keep, timeout)
        sup.futures = {}
        unhealthy = self._health_checks(stuck_ranks)
        if unhealthy and sup.cfg.in_job is None:
            return WorkerDiedError(sorted(unhealthy), sup.attempt,
                                   f"failed health checks: {unhealthy}; set InJobConfig to replace them")
        self.respawn.update(unhealthy)
        if stuck_ranks:
            if sup.cfg.in_job is None:
                return HangError(stuck_ranks, sup.attempt, timeout,
                                 "InProcessConfig.interrupt_timeout_s", timeout)
            log.warning("ranks %s did not unwind within %.1f s: respawning them",
                        stuck_ranks, timeout)
            for rank in stuck_ranks:
                sup.group.kill(rank)
            self.respawn.update(stuck_ranks)
        return None

    def _health_checks(self, stuck: list[int]) -> dict[int, str]:
        """Ranks that keep their process are asked for their health (CUDA on GPU)."""
        sup = self.sup
        ranks = [r for r in range(sup.group.world_size) if r not in self.respawn and r not in stuck]
        refs = {sup.group.actors[r].health.remote(): r for r in ranks}
        ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=HEALTH_TIMEOUT_S) if refs else ([], [])
        unhealthy = {refs[ref]: "no answer to the health check" for ref in late}
        for ref in ready:
            try:
                reason = ray.get(ref)
            except RayActorError as exc:
                reason = f"actor died: {exc}"
            if reason is not None:
                unhealthy[refs[ref]] = reason
        for rank, reason in unhealthy.items():
            log.warning("rank %d is unhealthy (%s): it gets a new process", rank, reason)
            sup.group.kill(rank)
        return unhealthy

    def _wait_unwound(self, keep: dict[Any, int], timeout_s: float) -> list[int]:
        """Collects interrupted ranks' outcomes; returns the ranks still stuck at the deadline.

        A rank whose side thread has gone silent for `InJobConfig.heartbeat_timeout_s` (its node
        is gone, its process frozen) is respawned at once instead of waiting out the timeout.
        """
        sup, deadline = self.sup, time.monotonic() + timeout_s
        in_job = sup.cfg.in_job
        while keep and time.monotonic() < deadline:
            ready, _ = ray.wait(list(keep), num_returns=len(keep), timeout=0.05)
            for ref in ready:
                rank = keep.pop(ref)
                try:
                    sup.record_outcome(ray.get(ref))
                except RayActorError:
                    self.respawn.add(rank)
            if in_job is None:
                continue
            now = time.monotonic()
            for ref, rank in list(keep.items()):
                if now - sup.ranks[rank].heartbeat_at > in_job.heartbeat_timeout_s:
                    log.warning("rank %d is silent for %.1f s: treating it as lost", rank,
                                now - sup.ranks[rank].heartbeat_at)
                    sup.group.kill(rank)
                    self.respawn.add(keep.pop(ref))
        return sorted(keep.values())


def _replacement(rank: int, info: dict[str, Any]) -> dict[str, Any]:
    """How a respawned rank's process started: `preimported` when it was booted ahead of time
    and had imported torch and the rest before the rank took it (or while the rank waited
    `preimport_wait_s` for it)."""
    pre = info.get("preimport") or {}
    return {"rank": rank, "pid": info.get("pid"),
            "preimported": "ended" in pre and "error" not in pre,
            "preimport_wait_s": pre.get("waited_s", 0.0)}
