"""Fault detection for the supervisor: the three signals, each timed.

1. An exception reported by a rank (its run future returns a failed outcome).
2. Actor death: the rank's run future raises `RayActorError` within milliseconds of the
   process dying (SIGKILL, OOM killer, segfault, lost node); no polling involved.
3. Silence: progress that stops advancing for longer than the phase's timeout (hang), or a
   side thread that stops sending heartbeats at all (frozen process, lost node).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import ray
from ray.exceptions import RayActorError

from ray_resilience.errors import HangError, WorkerDiedError, WorkerError
from ray_resilience._internal.supervisor.state import FaultEvent

log = logging.getLogger(__name__)

ERROR_GRACE_S = 0.05
"""After a first error, how long to wait for peers' errors so the earliest one is reported."""


def poll(sup: Any) -> FaultEvent | None:
    """Waits up to one monitor interval for a run future; returns the fault it revealed, if any."""
    ready, _ = ray.wait(list(sup.futures), num_returns=1, timeout=sup.cfg.monitor_interval_s)
    if ready:  # take everything that is done now, so simultaneous errors are grouped
        ready, _ = ray.wait(list(sup.futures), num_returns=len(sup.futures), timeout=0)
    return collect(sup, ready) or silence(sup)


def collect(sup: Any, ready: list) -> FaultEvent | None:
    errors: list[tuple[float, WorkerError]] = []
    died: list[int] = []
    _collect_into(sup, ready, errors, died)
    if (errors or died) and sup.futures:
        # Peers of a failed rank often fail a moment later with a secondary error (a closed
        # connection); a short grace lets the earliest error be the one reported.
        more, _ = ray.wait(list(sup.futures), num_returns=len(sup.futures), timeout=ERROR_GRACE_S)
        _collect_into(sup, more, errors, died)
    now = time.time()
    if died:
        return FaultEvent(cause="actor_died", ranks=sorted(died), attempt=sup.attempt,
                          t_detect=now, error=WorkerDiedError(sorted(died), sup.attempt,
                                                              "the actor process exited"))
    if errors:
        ordered = [e for _, e in sorted(errors, key=lambda item: item[0])]
        grouped = group_errors(ordered)
        return FaultEvent(cause="exception", ranks=grouped.ranks, attempt=sup.attempt,
                          t_detect=now, error=grouped)
    return None


def _collect_into(sup: Any, ready: list, errors: list, died: list[int]) -> None:
    for ref in ready:
        rank = sup.futures.pop(ref)
        try:
            outcome = ray.get(ref)
        except RayActorError as exc:
            died.append(rank)
            log.warning("rank %d died: %s", rank, exc)
            continue
        sup.record_outcome(outcome)
        if outcome.error is not None:
            errors.append((outcome.failed_at or 0.0, outcome.error))


def silence(sup: Any) -> FaultEvent | None:
    """Hangs (no progress within the phase's timeout) and lost heartbeats."""
    now, cfg = time.monotonic(), sup.cfg
    in_job = cfg.in_job
    with sup.record.lock:
        pending = [s for s in sup.ranks.values() if not s.done]
        lost = [s.rank for s in pending
                if in_job is not None and now - s.heartbeat_at > in_job.heartbeat_timeout_s]
        # Peers of a rank inside a long phase (validation) wait for it in their next collective:
        # while any rank is in a phase, the longest limit in force applies to every rank.
        limits = {s.rank: (sup.timeouts.limit(_phase_of(s)[0]), _phase_of(s)[1]) for s in pending}
        group = max(limits.values(), default=(0.0, ""))
        hung = []
        for s in pending:
            limit, setting = group if any(p.phase for p in pending) else limits[s.rank]
            if s.silent_for(now) > limit:
                hung.append((s.rank, s.silent_for(now), setting, limit))
    if lost:
        err = HangError(lost, sup.attempt, max(now - sup.ranks[r].heartbeat_at for r in lost),
                        "InJobConfig.heartbeat_timeout_s", in_job.heartbeat_timeout_s)
        return FaultEvent(cause="unresponsive", ranks=lost, attempt=sup.attempt,
                          t_detect=time.time(), error=err)
    if not hung:
        return None
    err = HangError([h[0] for h in hung], sup.attempt, max(h[1] for h in hung),
                    hung[0][2], hung[0][3])
    return FaultEvent(cause="hang", ranks=[h[0] for h in hung], attempt=sup.attempt,
                      t_detect=time.time(), error=err)


def _phase_of(status: Any) -> tuple[str, str]:
    """(timeout name, the setting that controls it) for where a rank is now."""
    if status.phase is not None:
        return status.phase, f"ResilienceConfig.phase_timeouts_s[{status.phase!r}]"
    if status.step is None:
        return "first_step", "ResilienceConfig.first_step_timeout_s"
    return "step", "ResilienceConfig.step_timeout_s"


def group_errors(errors: list[WorkerError]) -> WorkerError:
    """The earliest error, with the ranks of every identical error folded into it."""
    first = errors[0]
    ranks = sorted({r for e in errors if e.same_failure(first) for r in e.ranks})
    return WorkerError(ranks=ranks, attempt=first.attempt, exc_type=first.exc_type,
                       message=first.message, traceback=first.traceback, cause=first.cause)


def describe_fault(fault: FaultEvent) -> dict[str, Any]:
    """JSON-safe summary of one fault for `Result.faults` and results.json."""
    return {"cause": fault.cause, "ranks": fault.ranks, "attempt": fault.attempt,
            "step": fault.step, "t_fault": fault.t_fault, "t_detect": fault.t_detect,
            "fault_id": fault.detail.get("fault_id"), "kind": fault.detail.get("kind"),
            "nodes": list(fault.detail.get("nodes", ())),
            "respawned": list(fault.detail.get("respawned", ())),
            "excluded_nodes": list(fault.detail.get("excluded_nodes", ())),
            "replacements": list(fault.detail.get("replacements", ())),
            "error": str(fault.error).splitlines()[0] if fault.error else None}
