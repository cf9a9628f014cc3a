"""The supervisor actor: one per run; owns the run's state machine and repairs the job.

This is the engine file. `run()` drives `_step()` until a terminal state; each handler moves
at most one transition through `_set_state()`. Detection lives here (`detection.py` helps),
decisions in `policy.decide`, the recovery mechanics in `recovery_ops.py`. Control calls
(`heartbeat`, `fault_fired`, `status`, `abort`) are served concurrently with `run()` (threaded
actor), so they only touch state under the record's lock.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from typing import Any

import ray

from ray_resilience.config import ResilienceConfig, ScalingConfig
from ray_resilience.errors import RunAbortedError
from ray_resilience.goodput import compute_goodput
from ray_resilience.policy.state import FaultRecord, RecoveryState
from ray_resilience.timeouts import LearnedTimeouts
from ray_resilience._internal.supervisor import detection
from ray_resilience._internal.attempt import AttemptSpec
from ray_resilience._internal.constants import DEFAULT_SHUTDOWN_TIMEOUT_S, SHUTDOWN_TIMEOUT_ENV_VAR, env_float
from ray_resilience.policy.ladder import decide
from ray_resilience._internal.supervisor.rank_status import RankStatus
from ray_resilience._internal.supervisor.repair import Recovery
from ray_resilience._internal.supervisor.metrics import RunMetrics
from ray_resilience._internal.supervisor.run_record import RunRecord
from ray_resilience._internal.supervisor.state import FaultEvent, RunState
from ray_resilience._internal.worker_group.group import WorkerGroup

SPARE_REPLENISH_MAX_DELAY_S = 10.0
"""Longest a recovery that used warm spares holds back their replacements (see
`Supervisor._maybe_replenish_spares`)."""

log = logging.getLogger(__name__)


class Supervisor:
    """Runs one training run to a terminal state. Created by `ResilientTrainer.fit()`."""

    def __init__(self, *, train_fn: bytes, train_config: Any, scaling: ScalingConfig,
                 resilience: ResilienceConfig, run_name: str, run_dir: str,
                 env_vars: dict[str, str], storage_path: str = "",
                 storage_filesystem: Any = None) -> None:
        self._train_fn, self._train_config = train_fn, train_config
        self._scaling, self.cfg = scaling, resilience
        self.run_name, self._run_dir, self._env_vars = run_name, run_dir, env_vars
        self._storage_path, self._storage_fs = storage_path, storage_filesystem
        self.checkpoints: Any = None
        self._commit_poll_at = 0.0
        self._last_commit: int | None = None
        self._state = RunState.STARTING
        self.attempt = 0
        self.group: WorkerGroup | None = None
        self.futures: dict[Any, int] = {}
        self.ranks = {r: RankStatus(r) for r in range(scaling.num_workers)}
        self.timeouts = LearnedTimeouts(
            step_s=resilience.step_timeout_s, first_step_s=resilience.first_step_timeout_s,
            phases_s=dict(resilience.phase_timeouts_s), adaptive=resilience.adaptive_timeouts)
        self.record = RunRecord(scaling.num_workers, RunMetrics(run_name), self.timeouts)
        self._returns: dict[int, Any] = {}
        self.faults: list[FaultEvent] = []
        self._recovery: Recovery | None = None
        self.num_respawns = 0
        self.excluded_nodes: set[str] = set()
        """Nodes excluded after too many faults (InJobConfig.max_node_faults)."""
        self._error: BaseException | None = None
        self._abort = threading.Event()
        self._t_start = time.time()
        self._t_end: float | None = None
        self._pids: list[int] = []

    # --- control calls ----------------------------------------------------------------------

    def heartbeat(self, rank: int, attempt: int, step: int | None, step_time: float | None,
                  metrics: list[dict[str, Any]], saves: list, sent_at: float,
                  events: list[dict[str, Any]] = ()) -> None:
        """Called by each rank's side thread every progress interval."""
        with self.record.lock:
            self.ranks[rank].observe(attempt, step, step_time)
            if attempt == self.ranks[rank].attempt:
                inside = [e["name"] for e in events if e.get("phase") == "in_phase"]
                self.ranks[rank].set_phase(inside[-1] if inside else None, sent_at)
            self.record.add_events(attempt, events)
            self.record.add_reports(attempt, metrics)
            self.record.add_saves(attempt, saves, sent_at)

    def fault_fired(self, fault_id: str, info: dict[str, Any]) -> None:
        """An injected fault is about to fire (recorded before: a SIGKILL loses the rest)."""
        self.record.fault_fired(fault_id, info)

    def status(self) -> dict[str, Any]:
        """A snapshot for the driver's live display."""
        with self.record.lock:
            last = next((m for m in reversed(self.record.history) if m.get("rank") == 0), {})
            return {"state": self._state.label, "attempt": self.attempt,
                    "step": self.record.global_step, "metrics": dict(last),
                    "restarts": len(self.faults), "elapsed_s": time.time() - self._t_start}

    def checkpoint_stats(self) -> dict[str, Any] | None:
        """The checkpoint service's counters (`CheckpointService.stats`), None without one."""
        service = self.checkpoints
        return service.stats() if service is not None else None

    def abort(self) -> None:
        """Stops the run (Ctrl-C on the driver); `run()` returns soon after."""
        self._abort.set()

    # --- the state machine ------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Drives the run to a terminal state, tears everything down, returns the result."""
        try:
            while not self._state.terminal:
                self._step()
        except BaseException as exc:  # noqa: BLE001 - a supervisor bug still ends the run cleanly
            log.exception("supervisor failed")
            self._error = self._error or exc
            self._set_state(RunState.FAILED)
        finally:
            self._teardown()
        return self._result()

    def _step(self) -> None:
        if self._abort.is_set():
            self._error = RunAbortedError("the run was aborted from the driver")
            self._set_state(RunState.ABORTED)
            return
        handlers = {RunState.STARTING: self._on_starting, RunState.RUNNING: self._on_running,
                    RunState.RESTARTING: self._on_restarting,
                    RunState.RESPAWNING: self._on_restarting}
        handlers[self._state]()

    def _set_state(self, state: RunState) -> None:
        if state is not self._state:
            log.info("[%s attempt %d] %s -> %s", self.run_name, self.attempt,
                     self._state.label, state.label)
            self._state = state

    def _on_starting(self) -> None:
        me = ray.get_runtime_context().current_actor
        in_job = self.cfg.in_job
        self.group = WorkerGroup(self._scaling, self._train_fn, self._train_config, me,
                                 self._env_vars, num_spares=in_job.num_spares if in_job else 0,
                                 num_prestarted=in_job.num_prestarted_workers if in_job else 0)
        t0 = time.time()
        self.group.reserve(self.cfg.placement_timeout_s)
        self._startup_phase("placement", t0)
        # The checkpoint service (coordinator and writers: processes that import torch, seconds
        # each) starts while the ranks' actors do; the writers' nodes are the bundles' nodes.
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(self._start_checkpointing, self.group.bundle_nodes()) \
                if self.cfg.checkpoint is not None else None
            t0 = time.time()
            self.group.spawn()
            self._startup_phase("start_workers", t0)
            if pending is not None:
                self.checkpoints = pending.result()
                self._last_commit = self.checkpoints.latest_committed_step()
        self.record.start(time.time(), start_step=self._last_commit or 0)
        self.launch_attempt()
        self._set_state(RunState.RUNNING)

    def _start_checkpointing(self, node_ids: list[str]) -> Any:
        from ray_resilience._internal.checkpoint.service.service import CheckpointService

        t0 = time.time()
        service = CheckpointService.start(
            storage_path=self._storage_path, run_name=self.run_name,
            storage_filesystem=self._storage_fs, world_size=len(node_ids),
            node_ids_by_rank=node_ids, config=self.cfg.checkpoint)
        self._startup_phase("start_checkpointing", t0)
        return service

    def _startup_phase(self, name: str, t_start: float) -> None:
        with self.record.lock:
            self.record.phases.append({"phase": name, "t_start": t_start, "t_end": time.time(),
                                       "attempt": 0, "rank": None})

    def launch_attempt(self) -> None:
        """New rendezvous (fresh port: the attempt id isolates it) and one run call per rank."""
        group = self.group
        addr, port = group.master()
        local_rank, local_size, node_rank = group.layout()
        fired = set(self.record.fired)
        plan = self.cfg.fault_plan
        specs = [AttemptSpec(
            attempt=self.attempt, rank=r, world_size=group.world_size, local_rank=local_rank[r],
            local_world_size=local_size[r], node_rank=node_rank[r], master_addr=addr,
            master_port=port, backend=self._scaling.backend, use_gpu=self._scaling.use_gpu,
            run_name=self.run_name, run_dir=self._run_dir,
            process_group_timeout_s=self.cfg.process_group_timeout_s,
            rendezvous_timeout_s=(self.cfg.in_process.barrier_timeout_s if self.cfg.in_process
                                  else self.cfg.first_step_timeout_s),
            progress_interval_s=self.cfg.progress_interval_s,
            checkpoint_spec=self.checkpoints.rank_spec(r) if self.checkpoints else None,
            resume_hint=self.record.global_step or 0,
            faults=tuple(f for f in (plan or ()) if f.rank == r and f.id not in fired
                         and f.kind.fired_in_worker))
            for r in range(group.world_size)]
        with self.record.lock:
            for status in self.ranks.values():
                status.reset(self.attempt)
            self.record.launched_at[self.attempt] = time.time()
        self.futures = group.launch(specs)

    def shrink(self, dropped: list[int]) -> None:
        """Continues without `dropped`: ranks above each gap shift down, the world shrinks."""
        self.group.drop(dropped)
        world = self.group.world_size
        with self.record.lock:
            self.ranks = {r: RankStatus(r) for r in range(world)}
            self.record.world_size = world
        self._returns.clear()

    def _on_running(self) -> None:
        self._poll_commits()
        self._maybe_replenish_spares()
        self._maybe_prestart()
        fault = detection.poll(self)
        if fault is not None:
            self._on_fault(fault)
        elif not self.futures:
            self._set_state(RunState.FINISHED)

    def _maybe_replenish_spares(self) -> None:
        """New spares for those a recovery used, once its attempt completed a step (their
        start-up would take CPU from the recovery) or SPARE_REPLENISH_MAX_DELAY_S after it
        started, whichever comes first."""
        group = self.group
        if group is None or not group.spares_pending:
            return
        launched = self.record.launched_at.get(self.attempt, 0.0)
        if self.record.reached_by_attempt.get(self.attempt) is not None \
                or time.time() - launched >= SPARE_REPLENISH_MAX_DELAY_S:
            group.replenish_spares(self.excluded_nodes)

    def _maybe_prestart(self) -> None:
        """Idle Ray workers on the nodes where the run started (or a new spare took one), once
        the attempt completed a step: booting them earlier takes CPU from the ranks' start.
        A respawn asks at once (`WorkerGroup.replace`)."""
        group = self.group
        if group is not None and group.prestart_pending \
                and self.record.reached_by_attempt.get(self.attempt) is not None:
            group.prestart()

    def _poll_commits(self, *, force: bool = False) -> None:
        """Notes newly committed checkpoints in the timeline (a cheap call, at most 4 per second)."""
        now = time.monotonic()
        if self.checkpoints is None or (not force and now < self._commit_poll_at):
            return
        self._commit_poll_at = now + 0.25
        step = self.checkpoints.latest_committed_step()
        if step is not None and step != self._last_commit:
            self._last_commit = step
            self.record.timeline.checkpoint_committed(step, time.time())
            self.record.metrics.on_checkpoint(step, committed=True)

    def record_outcome(self, outcome: Any) -> None:
        """Folds one rank's attempt outcome into the record (its last metrics, its return)."""
        with self.record.lock:
            self.ranks[outcome.rank].observe(outcome.attempt, outcome.last_step,
                                             outcome.last_step_time)
            self.ranks[outcome.rank].done = outcome.status == "finished"
            # Its newest step, even if the heartbeat that carried it is still in flight.
            self.record.note_reached(outcome.attempt, outcome.last_step)
            self.record.add_events(outcome.attempt, outcome.events)
            self.record.add_reports(outcome.attempt, outcome.metrics)
            self.record.add_saves(outcome.attempt, outcome.checkpoint_saves, time.time())
            if outcome.status == "finished":
                self._returns[outcome.rank] = outcome.return_value

    def _on_fault(self, fault: FaultEvent) -> None:
        self.faults.append(fault)
        fault.step = self.record.global_step
        if self.group is not None:
            fault.detail["nodes"] = [self.group.node_of_rank(r) for r in fault.ranks
                                     if r < self.group.world_size]
        injected = self.record.match_injected(fault.ranks, fault.attempt)
        if injected is not None:
            fault.detail["fault_id"], info = injected
            fault.t_fault, fault.step, fault.detail["kind"] = info["t"], info["step"], info["kind"]
            if info["kind"] == "oom":
                fault.cause = "oom"  # a SIGKILL like any other: the plan says why
        log.error("[%s attempt %d] %s on ranks %s: %s", self.run_name, self.attempt,
                  fault.cause, fault.ranks, fault.error)
        decision = decide(fault, self._recovery_state(), self.cfg, self.num_respawns)
        if decision.action == "fail":
            self._error = decision.error
            self._set_state(RunState.FAILED)
            return
        self._recovery = Recovery(self, fault, decision)
        self._set_state(RunState.RESPAWNING if decision.respawn else RunState.RESTARTING)

    def _recovery_state(self) -> RecoveryState:
        progress = tuple(self.record.reached_by_attempt.get(a) for a in range(self.attempt + 1))
        return RecoveryState(
            attempt=self.attempt, world_size=self.group.world_size if self.group else
            self._scaling.num_workers,
            faults=tuple(FaultRecord(cause=f.cause, ranks=tuple(f.ranks), attempt=f.attempt,
                                     step=f.step, respawned=tuple(f.detail.get("respawned", ())),
                                     nodes=tuple(f.detail.get("nodes", ())))
                         for f in self.faults),
            progress_by_attempt=progress,
            rank_nodes=tuple(self.group.node_of_rank(r) for r in range(self.group.world_size))
            if self.group else (), excluded_nodes=frozenset(self.excluded_nodes))

    def _on_restarting(self) -> None:
        error = self._recovery.execute()
        if error is not None:
            self._error = error
            self._set_state(RunState.FAILED)
            return
        self._set_state(RunState.RUNNING)

    # --- teardown and result ----------------------------------------------------------------

    def _teardown(self) -> None:
        self._t_end = time.time()
        if self.group is not None:
            self._pids = self.group.pids()
            try:
                self.group.shutdown(env_float(SHUTDOWN_TIMEOUT_ENV_VAR, DEFAULT_SHUTDOWN_TIMEOUT_S))
            except Exception:  # noqa: BLE001 - teardown must finish; Ray reaps what is left
                log.exception("worker group shutdown failed")
            self.group = None
        if self.checkpoints is not None:
            try:
                self._poll_commits(force=True)
                self._checkpoint_stats = self.checkpoints.stats()
            except Exception:  # noqa: BLE001 - stats are informative only
                log.exception("checkpoint stats unavailable")
            self.checkpoints.shutdown()

    def _result(self) -> dict[str, Any]:
        world = self.record.world_size
        history = self.record.sorted_history()
        final = next((m for m in reversed(history) if m["rank"] == 0), {})
        self.record.timeline.run_finished(self._t_end or time.time(),
                                          self.record.global_step or 0)
        try:
            goodput = compute_goodput(self.record.timeline)
            self.record.metrics.on_goodput(goodput)
        except Exception:  # noqa: BLE001 - accounting must never fail a finished run
            log.exception("goodput accounting failed")
            goodput = None
        return {
            "state": self._state.label, "error": self._error, "metrics": final,
            "metrics_history": history, "run_dir": self._run_dir, "attempts": self.attempt + 1,
            "faults": [detection.describe_fault(f) for f in self.faults],
            "return_values": [self._returns.get(r) for r in range(world)],
            "worker_pids": self._pids, "wall_s": (self._t_end or time.time()) - self._t_start,
            "goodput": goodput, "timeline": self.record.timeline,
            "timeouts": self.timeouts.snapshot(),
            "checkpoint": {"latest_committed_step": self._last_commit,
                           "loads": self.record.loads, "phases": self.record.phases,
                           "stats": getattr(self, "_checkpoint_stats", None)}
            if self.checkpoints is not None else None,
        }
