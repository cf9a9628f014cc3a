"""The supervisor actor: one per run; owns the run's state machine and repairs the job.

The engine file. `run()` calls `_step()` until a terminal state: each step runs the current
state's handler, which returns the next state, and `_set_state()` moves there and fires the
callbacks. Detection (`detection.py`) reports faults, the recovery policy decides, `repair.py`
carries the decision out; only this class changes the run (attempt, world size, faults). Control
calls (`heartbeat`, `fault_fired`, `status`, `abort`) are served concurrently with `run()`
(threaded actor), so they only touch state under the record's lock.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import posixpath
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ray_resilience._internal.attempt import AttemptSpec
from ray_resilience._internal.checkpoint.format.storage import resolve
from ray_resilience._internal.constants import (
    DEFAULT_SHUTDOWN_TIMEOUT_S,
    SHUTDOWN_TIMEOUT_ENV_VAR,
    env_float,
)
from ray_resilience._internal.control.batch import ProgressBatch
from ray_resilience._internal.control.metrics_log import MetricsLog
from ray_resilience._internal.preemption import PreemptionWatch
from ray_resilience._internal.supervisor.checkpoints import RunCheckpoints
from ray_resilience._internal.supervisor.detection import FaultDetector
from ray_resilience._internal.supervisor.dispatch import Dispatcher
from ray_resilience._internal.supervisor.faults import FaultHistory, detected_event
from ray_resilience._internal.supervisor.metrics import MetricsCallback, RunMetrics
from ray_resilience._internal.supervisor.outcome import RunOutcome
from ray_resilience._internal.supervisor.recorders import (
    FaultStepRevised,
    RecentEvents,
    RecoveryPhase,
    TimelineRecorder,
)
from ray_resilience._internal.supervisor.repair import Repair, RepairOutcome
from ray_resilience._internal.supervisor.run_record import Clock, RunRecord
from ray_resilience._internal.supervisor.state import (
    RUNNING,
    SCHEDULING,
    STARTING,
    DetectedFault,
    Ended,
    Repairing,
    RunState,
    State,
)
from ray_resilience._internal.worker_group.group import WorkerGroup, create_worker_group
from ray_resilience._internal.worker_group.imports import BackgroundImports
from ray_resilience.callbacks import Callback, RunEnded, RunStarted, StateChanged
from ray_resilience.checkpoint.errors import CheckpointError
from ray_resilience.config import ResilienceConfig, ScalingConfig
from ray_resilience.errors import (
    ConfigError,
    PreemptedError,
    ResilienceError,
    RunAbortedError,
    format_ranks,
)
from ray_resilience.policy.base import Action, Decision
from ray_resilience.policy.ladder import create_recovery_policy
from ray_resilience.policy.state import FaultCause
from ray_resilience.timeouts import LearnedTimeouts

METRICS_FLUSH_INTERVAL_S = 1.0
"""How often the metrics log's buffer is written to the run folder."""
SPARE_REPLENISH_MAX_DELAY_S = 10.0
"""Longest a recovery that used warm spares holds back their replacements (see `_upkeep`)."""

log = logging.getLogger(__name__)

WorkerGroupFactory = Callable[..., WorkerGroup]
"""Builds the run's group: keywords scaling, train_fn, train_config, env_vars, num_spares,
num_prestarted (see `create_worker_group`; unit tests pass a dummy's)."""


class Supervisor:
    """Runs one training run to a terminal state. Created by `ResilientTrainer.fit()`."""

    def __init__(self, *, train_fn: bytes, train_config: Any, scaling: ScalingConfig,
                 resilience: ResilienceConfig, run_name: str, run_dir: str,
                 env_vars: dict[str, str], storage_path: str = "", storage_filesystem: Any = None,
                 callbacks: Sequence[Callback] = (), datasets: dict[str, Any] | None = None,
                 worker_group_factory: WorkerGroupFactory | None = None,
                 clock: Clock | None = None, log_metrics: bool = True) -> None:
        self._train_fn, self._train_config = train_fn, train_config
        self._datasets: dict[str, Any] = dict(datasets or {})
        """Ray Datasets by name: materialized when the run schedules (`DatasetSource`s after)."""
        self._scaling, self._cfg = scaling, resilience
        self.run_name, self._run_dir, self._env_vars = run_name, run_dir, env_vars
        self._group_factory = worker_group_factory or create_worker_group
        self._clock = clock or Clock()
        self._timeline, self._recent = TimelineRecorder(), RecentEvents()
        self._dispatcher = Dispatcher([self._timeline, self._recent,
                                       MetricsCallback(RunMetrics(run_name)), *callbacks])
        self._timeouts = LearnedTimeouts(
            step_s=resilience.step_timeout_s, first_step_s=resilience.first_step_timeout_s,
            phases_s=dict(resilience.phase_timeouts_s), adaptive=resilience.adaptive_timeouts)
        self._metrics_log = _open_metrics_log(storage_path, storage_filesystem, run_name,
                                              log_metrics)
        self._flushed_at = 0.0
        self._agent_restarts = 0
        self.record = RunRecord(scaling.num_workers, emit=self._dispatcher.emit,
                                timeouts=self._timeouts, clock=self._clock,
                                metrics_log=self._metrics_log)
        self._policy = create_recovery_policy(resilience)
        self._state: State = SCHEDULING
        self._attempt = 0
        self._group: WorkerGroup | None = None
        self._detector: FaultDetector | None = None
        self._futures: dict[Any, int] = {}
        self._checkpoints = RunCheckpoints(
            resilience.checkpoint, storage_path=storage_path, storage_filesystem=storage_filesystem,
            run_name=run_name, record=self.record, clock=self._clock, emit=self._dispatcher.emit)
        self._history = FaultHistory()
        self._imports = BackgroundImports(resilience.background_imports)
        self._preemption = PreemptionWatch()
        self._abort = threading.Event()
        self._t_start, self._t_end = self._clock.time(), 0.0
        self._pids: list[int] = []
        self._handlers: dict[RunState, Callable[[Any], State]] = {
            RunState.SCHEDULING: self._on_scheduling, RunState.STARTING: self._on_starting,
            RunState.RUNNING: self._on_running, RunState.RESTARTING: self._on_repairing,
            RunState.RESPAWNING: self._on_repairing}

    @property
    def state(self) -> RunState:
        return self._state.kind

    @property
    def attempt(self) -> int:
        return self._attempt

    # --- control calls ----------------------------------------------------------------------

    def heartbeat(self, rank: int, attempt: int, step: int | None, step_time: float | None,
                  metrics: list[dict[str, Any]], saves: list, sent_at: float,
                  events: Sequence[dict[str, Any]] = (), activity: int | None = None) -> None:
        """A rank's side thread, every progress interval, when its node has no agent."""
        self.record.heartbeat(rank, attempt, step, step_time, metrics, saves, sent_at,
                              list(events), activity)

    def progress(self, batch: ProgressBatch) -> None:
        """A node agent's batch: its ranks' heartbeats of one interval."""
        self.record.fold(batch)

    def agent_restarted(self, node: str) -> None:
        """Ray restarted `node`'s agent: heartbeats it had not forwarded are lost, so that
        node's ranks get a fresh allowance instead of being declared lost."""
        group = self._group
        ranks = [r for r, n in enumerate(group.node_ids()) if n == node] if group else []
        log.warning("[%s] node agent on %s restarted; ranks %s keep running", self.run_name, node,
                    ranks)
        self._agent_restarts += 1
        self.record.excuse(ranks)

    def fault_fired(self, fault_id: str, info: dict[str, Any]) -> None:
        """An injected fault is about to fire (recorded before: a SIGKILL loses the rest)."""
        self._history.fault_fired(fault_id, info)

    def rank_terminated(self, rank: int) -> None:
        """A rank's process got SIGTERM: the ranks save a step and that rank moves."""
        self._preemption.rank_terminated(rank)

    def status(self) -> dict[str, Any]:
        """A snapshot for the driver's live display, with the recent events to print."""
        with self.record.lock:
            return {"state": self._state.kind.label, "attempt": self._attempt,
                    "step": self.record.global_step, "metrics": self.record.last_metrics(),
                    "restarts": len(self._history.faults), "events": self._recent.snapshot(),
                    "elapsed_s": self._clock.time() - self._t_start}

    def checkpoint_stats(self) -> dict[str, Any] | None:
        """The checkpoint service's counters (`CheckpointService.stats`), None without one."""
        return self._checkpoints.stats()

    def abort(self) -> None:
        """Stops the run (Ctrl-C on the driver); `run()` returns soon after."""
        self._abort.set()

    # --- the state machine ------------------------------------------------------------------

    def run(self) -> RunOutcome:
        """Drives the run to a terminal state, tears everything down, returns the outcome."""
        try:
            while not self._state.kind.terminal:
                self._step()
        except ResilienceError as exc:  # a typed end from below, e.g. a rank that cannot start
            log.error("[%s] run failed: %s", self.run_name, exc)
            self._set_state(Ended(RunState.FAILED, exc))
        except BaseException as exc:  # a supervisor bug still ends the run cleanly
            log.exception("supervisor failed")
            self._set_state(Ended(RunState.FAILED, exc))
        finally:
            self._teardown()
        return self._finish()

    def _step(self) -> None:
        """Runs the current state's handler once and moves to the state it returns."""
        current = self._state
        if self._abort.is_set():
            following = Ended(RunState.ABORTED,
                              RunAbortedError("the run was aborted from the driver"))
        else:
            following = self._handlers[current.kind](current)
        if current.kind.needs_new_attempt and following.kind is RunState.RUNNING:
            self._start_attempt(self._attempt + 1, after=self._history.last)
        self._set_state(following)
        self._dispatcher.flush()

    def _set_state(self, state: State) -> None:
        """The one place the state changes; callbacks hear of it here."""
        previous = self._state
        if state is previous:
            return
        log.info("[%s attempt %d] %s -> %s", self.run_name, self._attempt,
                 previous.kind.label, state.kind.label)
        self._state = state
        self._dispatcher.emit(StateChanged(previous=previous.kind.label, state=state.kind.label,
                                           attempt=self._attempt, t=self._clock.time()))
        self._dispatcher.flush()

    def _on_scheduling(self, _: State) -> State:
        """Takes the run's lease, creates the worker group and waits for its placement group."""
        try:
            self._checkpoints.claim(self._abort.is_set)
        except CheckpointError as exc:  # another job holds the run, or storage refused the lease
            return Ended(RunState.FAILED, exc)
        in_job = self._cfg.in_job
        self._group = self._group_factory(
            scaling=self._scaling, train_fn=self._train_fn, train_config=self._train_config,
            env_vars=self._env_vars, num_spares=in_job.num_spares if in_job else 0,
            num_prestarted=in_job.num_prestarted_workers if in_job else 0)
        self._detector = FaultDetector(self._group, self._cfg, self._timeouts, self._clock)
        if self._datasets:
            t0 = self._clock.time()
            from ray_resilience._internal.data.materialize import materialize  # noqa: PLC0415 - Ray Data loads only for runs with datasets

            self._datasets = materialize(self._datasets)
            self.record.startup_phase("datasets", t0, self._clock.time())
        t0 = self._clock.time()
        self._group.reserve(self._cfg.placement_timeout_s)
        self.record.startup_phase("placement", t0, self._clock.time())
        return STARTING

    def _on_starting(self, _: State) -> State:
        """Starts the ranks' actors and, alongside (writers import torch: seconds each), the
        checkpoint service on the bundles' nodes; then launches attempt 0."""
        group = self._group
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            pending = pool.submit(self._checkpoints.start, group.bundle_nodes()) \
                if self._checkpoints.enabled else None
            t0 = self._clock.time()
            group.spawn()
            self.record.startup_phase("start_workers", t0, self._clock.time())
            if pending is not None:
                pending.result()
        self._imports.start_if_idle(group, self._checkpoints, self._clock.time())
        self._dispatcher.emit(RunStarted(
            run_name=self.run_name, world_size=self.record.world_size,
            start_step=self._checkpoints.last_commit or 0, t=self._clock.time()))
        self._start_attempt(0)
        return RUNNING

    def _start_attempt(self, attempt: int, after: DetectedFault | None = None) -> None:
        """Launches `attempt`; after a repair, it is the recovery from fault `after`."""
        self._attempt = attempt
        if after is not None:
            mechanism = "respawn" if after.respawned else "in-process"
            self.record.expect_recovery(attempt, after, mechanism)
        self._launch()
        if after is not None and after.t_torn is not None:
            t = self._clock.time()
            self._dispatcher.emit(RecoveryPhase(fault_id=after.fault_id, phase="rendezvous",
                                                t_start=after.t_torn, t_end=t))
            log.info("[%s] attempt %d started after %s (respawned %s) in %.2f s", self.run_name,
                     attempt, after.cause.value, list(after.respawned), t - after.t_detect)

    def _launch(self) -> None:
        """New rendezvous (fresh port: the attempt id isolates it) and one run call per rank."""
        group, cfg = self._group, self._cfg
        addr, port = group.master()
        local_rank, local_size, node_rank = group.layout()
        fired, plan = self._history.fired(), cfg.fault_plan or ()
        sinks = group.progress_sinks(cfg.progress_interval_s)
        specs = [AttemptSpec(
            attempt=self._attempt, rank=r, world_size=group.world_size, local_rank=local_rank[r],
            local_world_size=local_size[r], node_rank=node_rank[r], master_addr=addr,
            master_port=port, backend=self._scaling.backend, use_gpu=self._scaling.use_gpu,
            run_name=self.run_name, run_dir=self._run_dir,
            process_group_timeout_s=cfg.process_group_timeout_s,
            rendezvous_timeout_s=(cfg.in_process.barrier_timeout_s if cfg.in_process
                                  else cfg.first_step_timeout_s),
            progress_interval_s=cfg.progress_interval_s, busy_cap_s=self._timeouts.limit("step"),
            checkpoint_spec=self._checkpoints.rank_spec(r),
            resume_hint=self.record.global_step or 0,
            faults=tuple(f for f in plan if f.rank == r and f.id not in fired
                         and f.kind.fired_in_worker),
            progress_sink=sinks[r], datasets=self._datasets)
            for r in range(group.world_size)]
        self.record.start_attempt(self._attempt)
        self._futures = group.launch(specs)

    def _on_running(self, current: State) -> State:
        lost = self._checkpoints.poll()
        if lost is not None:  # another job took the run over: this one may not go on
            return Ended(RunState.FAILED, lost)
        if self.record.first_step_by_attempt:  # stepped: writers may take CPU for DCP now
            self._checkpoints.warm()
        self._upkeep()
        self._watch_preemption()
        self._flush_metrics()
        found = self._detector.collect(self._futures, self._attempt)
        if any(o.status == "finished" or self.record.recovering(o.attempt)
               for o in found.outcomes):  # what agents hold was reported before what these carry
            self._drain_agents()
        for outcome in found.outcomes:
            self.record.add_outcome(outcome)
        self._preemption.note_outcomes(found.outcomes)
        for ref in found.done:
            self._futures.pop(ref, None)
        fault = found.fault
        if fault is None and self._detector.silence_due(self.record.world_size):
            fault = self._detector.silence(self.record.rank_statuses(), self._attempt)
        if fault is not None:
            self._preemption.take()  # seen again, if still draining, in the next attempt
            return self._on_fault(fault)
        if self._futures:
            return current
        if self._preemption.notice is not None and self._preemption.stopped:
            return self._on_preempted()
        self._drain_agents()  # the last steps' reports may still sit in node agents
        return Ended(RunState.FINISHED)

    def _watch_preemption(self) -> None:
        """On a new drain notice (or a rank's SIGTERM), asks every rank to stop at one step."""
        newest = self.record.newest_step()
        notice = self._preemption.check(self._group, self._attempt, newest, self._step_time())
        if notice is not None:
            self._group.stop_at(list(range(self._group.world_size)), self._attempt,
                                notice.step, notice.deadline)

    def _step_time(self) -> float | None:
        """Recent seconds per step on rank 0 (None before two steps)."""
        times = [m["time"] for m in self.record.recent_history()[-16:] if "time" in m]
        return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None

    def _on_preempted(self) -> State:
        """Every rank saved the agreed step and stopped: the preempted ranks move elsewhere
        (their nodes excluded) and all ranks resume from that step."""
        notice = self._preemption.take()
        self._preemption.stopped.clear()
        fix = ("resubmit with the same RunConfig.name to resume from it, or set "
               "ResilienceConfig.in_job (InJobConfig) to move the ranks within the job.")
        error = PreemptedError(notice.ranks, notice.nodes, notice.step, fix)
        fault = self._history.add(DetectedFault(
            cause=FaultCause.PREEMPTED, ranks=notice.ranks, attempt=self._attempt,
            t_detect=notice.t_notice, t_fault=notice.t_notice, error=error),
            self.record, self._group)
        log.warning("[%s attempt %d] preempted: ranks %s stopped at step %s", self.run_name,
                    self._attempt, list(notice.ranks), fault.step)
        self._dispatcher.emit(detected_event(fault))
        self._dispatcher.flush()
        if self._cfg.in_job is None:
            return Ended(RunState.FAILED, error)
        return Repairing.of(fault, Decision.respawn_ranks(notice.ranks, notice.nodes))

    def _drain_agents(self) -> None:
        for batch in self._group.drain_progress():
            self.record.fold(batch)
        self.record.release_parked()

    def _flush_metrics(self) -> None:
        now = self._clock.monotonic()
        if now - self._flushed_at >= METRICS_FLUSH_INTERVAL_S:
            self._flushed_at = now
            self._metrics_log.flush()

    def _upkeep(self) -> None:
        """New spares for those a recovery used, once its attempt completed a step (their
        start-up would take CPU from the recovery) or SPARE_REPLENISH_MAX_DELAY_S after it
        started; prestarted workers once the attempt completed a step (at once where the
        background imports start with the ranks)."""
        group, reached = self._group, self.record.reached_by_attempt.get(self._attempt)
        if group.spares_pending:
            launched = self.record.launched_at.get(self._attempt, 0.0)
            if reached is not None or self._clock.time() - launched >= SPARE_REPLENISH_MAX_DELAY_S:
                group.replenish_spares(self._history.excluded_nodes)
        self._imports.upkeep(group, self._attempt, stepped=reached is not None,
                             t=self._clock.time())

    def _on_fault(self, fault: DetectedFault) -> State:
        fault = self._history.add(fault, self.record, self._group)
        log.error("[%s attempt %d] %s on ranks %s: %s", self.run_name, self._attempt,
                  fault.cause.value, format_ranks(fault.ranks), fault.error)
        self._dispatcher.emit(detected_event(fault))
        self._dispatcher.flush()
        decision = self._policy.decide(fault.record(), self._history.state(
            self._attempt, self._group.world_size, self.record, self._group))
        if decision.action is Action.RESPAWN and self._cfg.in_job is None:
            decision = Decision.fail(ConfigError(
                "ResilienceConfig.recovery_policy", self._policy,
                "it decided to respawn ranks, which needs ResilienceConfig.in_job (InJobConfig)."))
        if decision.action is Action.FAIL:
            return Ended(RunState.FAILED, decision.error or fault.error)
        return Repairing.of(fault, decision)

    def _on_repairing(self, current: Repairing) -> State:
        """Carries out the decision; RUNNING next starts the new attempt (see `_step`)."""
        done = Repair(self._group, self.record, self._cfg, self._scaling, self._clock,
                      decision=current.decision, attempt=self._attempt,
                      on_node=self._checkpoints.prelaunch,  # a moved rank's writers start early
                      ).run(self._futures, frozenset(self._history.excluded_nodes))
        self._futures = {}
        for outcome in done.outcomes:
            self.record.add_outcome(outcome)
        closed = None if done.t_torn is None else self._close_attempt(current.fault, done)
        self._history.repaired(done, revised=closed)
        if done.error is not None:
            return Ended(RunState.FAILED, done.error)
        if done.dropped:  # continue without them: ranks above each gap shift down
            self._group.drop(list(done.dropped))
            self.record.resize(self._group.world_size)
        if done.respawned:
            self._checkpoints.ensure_writers(self._group.node_ids())
        return RUNNING

    def _close_attempt(self, fault: DetectedFault, done: RepairOutcome) -> DetectedFault:
        """Counts the steps the lost ranks had finished but not reported; times the teardown."""
        self._drain_agents()
        late = self.record.close_attempt(self._attempt, set(done.respawned))
        if late:
            fault = dataclasses.replace(fault, step=max(fault.step or 0, late[-1]))
            self._dispatcher.emit(FaultStepRevised(fault_id=fault.fault_id, step=late[-1]))
        self._dispatcher.emit(RecoveryPhase(fault_id=fault.fault_id, phase="teardown",
                                            t_start=fault.t_detect, t_end=done.t_torn))
        return dataclasses.replace(fault, t_torn=done.t_torn)

    # --- teardown and outcome ---------------------------------------------------------------

    def _teardown(self) -> None:
        self._t_end = self._clock.time()
        if self._group is not None:
            self._pids = self._group.pids()
            try:
                self._drain_agents()
            except Exception:  # teardown must finish; the reports are lost, not the run
                log.exception("could not collect the node agents' last reports")
            try:
                timeout_s = env_float(SHUTDOWN_TIMEOUT_ENV_VAR, DEFAULT_SHUTDOWN_TIMEOUT_S)
                self._group.shutdown(timeout_s)
            except Exception:  # teardown must finish; Ray reaps what is left
                log.exception("worker group shutdown failed")
            self._group = None
        self._checkpoints.shutdown()
        self._metrics_log.close()

    def _finish(self) -> RunOutcome:
        """Closes the timeline, tells the callbacks, and builds the outcome for the driver."""
        self._dispatcher.flush()
        goodput = self._timeline.close(self._t_end, self.record.global_step or 0)
        ended = self._state
        error = ended.error if isinstance(ended, Ended) else None
        self._dispatcher.emit(RunEnded(
            state=ended.kind.label, error=error, attempts=self._attempt + 1,
            final_step=self.record.global_step, goodput=goodput, t=self._t_end))
        self._dispatcher.flush()
        return RunOutcome(
            state=ended.kind.label, error=error, metrics_history=self.record.recent_history(),
            metrics=self.record.last_metrics(), control=self._control_summary(),
            attempts=self._attempt + 1, faults=self._history.describe(),
            return_values=[self.record.returns.get(r) for r in range(self.record.world_size)],
            worker_pids=self._pids, wall_s=self._t_end - self._t_start, goodput=goodput,
            timeouts=self._timeouts.snapshot(), checkpoint=self._checkpoints.summary(),
            phases=list(self.record.phases),
            dropped_saves=list(self._checkpoints.dropped),
            dropped_total=self._checkpoints.dropped_total,
            callback_failures=self._dispatcher.failures())

    def _control_summary(self) -> dict[str, Any]:
        return {"batches": self.record.num_batches, "reports": self.record.num_reports,
                "agent_restarts": self._agent_restarts, "metrics_log": self._metrics_log.path,
                "metrics_log_bytes": self._metrics_log.bytes_written,
                "background_imports": self._imports.summary()}


def _open_metrics_log(storage_path: str, storage_filesystem: Any, run_name: str,
                      enabled: bool) -> MetricsLog:
    """The run's metrics log in its folder; a disabled one without a storage path."""
    if not enabled or not storage_path:
        return MetricsLog(None, "")
    fs, base = resolve(storage_path, storage_filesystem)
    return MetricsLog(fs, posixpath.join(base, run_name))
