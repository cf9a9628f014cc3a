"""The rank's actor: runs the user's train function in its own thread, one attempt at a time,
while status and control calls are served. Only torch.distributed is rebuilt between attempts.
"""

from __future__ import annotations

import datetime
import faulthandler
import inspect
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import ray
import torch
import torch.distributed as dist
from ray import cloudpickle

# Imported while the actor is created on one thread: Ray deserializes call arguments on
# others, and two threads importing a module at once can see it half-initialized.
import ray_resilience._internal.checkpoint.service.service  # noqa: F401 - see above
from ray_resilience._internal.attempt import AttemptOutcome, AttemptSpec
from ray_resilience._internal.checkpoint.rank.loader import warm_restore_path
from ray_resilience._internal.checkpoint.rank.rank_checkpointer import RankCheckpointer
from ray_resilience._internal.constants import (
    DEFAULT_FINAL_SAVE_TIMEOUT_S,
    DEFAULT_STORE_PROBE_INTERVAL_S,
    FINAL_SAVE_TIMEOUT_ENV_VAR,
    STORE_PROBE_INTERVAL_ENV_VAR,
    env_float,
)
from ray_resilience._internal.process_groups.abort import CollectiveAborter
from ray_resilience._internal.process_groups.teardown import (
    freeze_startup_objects,
    teardown_process_groups,
)
from ray_resilience._internal.rank.errors_capture import describe, raised_in_distributed
from ray_resilience._internal.rank.interrupt import (
    TrainingInterrupted,
    async_raise,
    cancel_async_raise,
)
from ray_resilience._internal.rank.liveness import ActivityProbe
from ray_resilience._internal.rank.progress import ProgressForwarder
from ray_resilience.context import PreemptionStop, TrainContext, _Session, _set_session
from ray_resilience.testing.fire import fire

log = logging.getLogger(__name__)


def _wait_listening(host: str, port: int, timeout_s: float) -> None:
    """Returns once rank 0's store accepts connections, or at the timeout: a store client that
    finds no server backs off 0.3-0.7 s."""
    deadline = time.monotonic() + timeout_s
    interval_s = env_float(STORE_PROBE_INTERVAL_ENV_VAR, DEFAULT_STORE_PROBE_INTERVAL_S)
    while True:
        try:
            socket.create_connection((host, port), timeout=1.0).close()
            return
        except OSError:
            if time.monotonic() >= deadline:
                return
            time.sleep(interval_s)


def _usable_cpus() -> int:
    """Cores this process may run on (its affinity; off Linux, the machine's count)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)


def _serialized_runtime_env() -> str | None:
    """This actor's runtime env as the raylet keys worker processes (None if Ray's internals moved).
    """
    try:
        return ray._private.worker.global_worker.core_worker.get_current_runtime_env()
    except Exception:  # noqa: BLE001 - an optimization's input
        return None


class Worker:
    """One rank. Created once per rank (and again only when the rank is respawned)."""

    def __init__(self, train_fn: Callable[..., Any], train_config: dict[str, Any] | None,
                 supervisor: Any) -> None:
        self._train_fn, self._train_config = train_fn, train_config
        self._supervisor = supervisor
        self._thread: threading.Thread | None = None
        self._attempt: int | None = None
        self._interrupted = threading.Event()
        self._interrupt_lock = threading.Lock()
        self._interruptible = False
        self._release_thread: threading.Thread | None = None
        self._frozen = False
        self._in_rendezvous = False
        self._uses_gpu = False
        self._setup_lock = threading.Lock()
        """Held by prewarm(); run_attempt() waits for it (never two imports racing)."""
        self._aborter = CollectiveAborter()
        self._fired: set[str] = set()
        self._checkpointer: Any = None
        self._session: _Session | None = None
        """The running attempt's session (`stop_at` reaches into it)."""
        self._startup: list[dict[str, Any]] = []
        """This process's start-up phases, reported with the next attempt it runs."""

    def note_startup(self, t_process: float | None, t_init: float, t_imported: float) -> None:
        """Start-up phases: process boot (to the actor's `__init__`) and the imports after."""
        if t_process is not None:
            # /proc's boot time has whole seconds: a process started just before its actor's
            # `__init__` can read later than it. Such a boot took less than we can measure.
            self._startup.append({"phase": "process_start", "t_start": min(t_process, t_init),
                                  "t_end": t_init})
        self._startup.append({"phase": "imports", "t_start": t_init, "t_end": t_imported})

    def on_sigterm(self) -> bool:
        """This process got SIGTERM: while an attempt runs, the supervisor hears of it and every
        rank saves a step before this one moves (`PreemptionWatch`). False: nothing runs here,
        the caller exits as Ray would."""
        session = self._session
        if session is None:
            return False
        rank = session.context.world_rank
        log.warning("rank %d got SIGTERM: saving a step before leaving", rank)
        # A thread: the handler runs on the main thread between Ray's task calls.
        threading.Thread(target=self._supervisor.rank_terminated.remote, args=(rank,),
                         daemon=True, name="rr-sigterm").start()
        return True

    def info(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(),
                "pid": os.getpid(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                "cpus": _usable_cpus(),
                "runtime_env": _serialized_runtime_env()}

    def prewarm(self) -> None:
        """Imports what every attempt needs, runs one FSDP2 step and restore on a toy model, and
        freezes start-up objects: an interrupt inside a first-time lazy import would break every
        later attempt. Safe to call more than once."""
        with self._setup_lock:
            if self._frozen:
                return
            import torch.distributed.checkpoint  # noqa: PLC0415 - the warm-up's imports
            import torch.distributed.fsdp  # noqa: PLC0415 - the warm-up's imports
            import torch.distributed.tensor  # noqa: F401, PLC0415 - the warm-up's imports

            import ray_resilience._internal.checkpoint.rank.rank_checkpointer  # noqa: F401, PLC0415 - the warm-up's imports

            t0 = time.time()
            # Freeze import-time objects so no gc pass walks them; again after the warm-up.
            freeze_startup_objects(collect=False)
            _warm_fsdp(self.free_port())
            freeze_startup_objects(collect=False)
            self._frozen = True
            self._startup.append({"phase": "prewarm", "t_start": t0, "t_end": time.time()})

    def health(self) -> str | None:
        """None when this rank may keep its process for the next attempt, else the reason."""
        if self._uses_gpu:
            from ray_resilience._internal.rank.health import cuda_health  # noqa: PLC0415 - CUDA ranks only

            return cuda_health(0)
        return None

    def snapshot_source(self) -> RankCheckpointer | None:
        """This rank's checkpointer, which its checkpoint writer takes snapshots from (through
        the actor: `WorkerActor`, a `SnapshotSource`); None when it has none."""
        return self._checkpointer

    def free_port(self) -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    def interrupt(self, attempt: int, stacks_after_s: float | None = None) -> bool:
        """Stops `attempt` now: aborts its collectives and raises into the training thread.
        False when that attempt is not running here. `stacks_after_s`: if the attempt has not
        unwound by then, every thread's stack goes to this process's stderr (the worker's log),
        from faulthandler's own thread, which needs no GIL: what the rank was stuck in before
        the supervisor kills it."""
        thread = self._thread
        with self._interrupt_lock:
            if self._attempt != attempt or thread is None or not self._interruptible:
                return False
            self._interrupted.set()
            async_raise(thread.ident, TrainingInterrupted)  # pending until the C call returns
            if stacks_after_s is not None:  # cancelled once `run_attempt` returns
                try:
                    faulthandler.dump_traceback_later(stacks_after_s, file=sys.stderr)
                except (AttributeError, ValueError, OSError) as exc:  # stderr has no descriptor
                    log.warning("no stack dump if this rank does not unwind: %s", exc)
        # The abort makes it happen now; cutting the rendezvous store is safe (fresh per attempt).
        self._aborter.abort(include_store=self._in_rendezvous)
        return True


    def stop_at(self, attempt: int, step: int, deadline: float) -> int | None:
        """Preemption: at `step`, save it, wait until it is durable (until `deadline`, wall time)
        and leave the train function. Returns the newest step this rank reported."""
        session = self._session
        if session is None or self._attempt != attempt:
            return None
        session.stop_at = (step, deadline)
        if session.step is not None and session.step >= step:
            log.warning("stop requested at step %d, but this rank already reported step %d",
                        step, session.step)
        return session.step

    def run_attempt(self, spec: AttemptSpec) -> AttemptOutcome:
        """Runs the train function for one attempt; returns when it ends, fails or is stopped."""
        t0 = time.time()
        faulthandler.cancel_dump_traceback_later()  # one an earlier attempt's interrupt left
        session = _Session(self._context(spec), faults=self._fault_hook(spec),
                           datasets=spec.datasets)
        probe = ActivityProbe(busy_cap_s=spec.busy_cap_s)
        forwarder = ProgressForwarder(spec.progress_sink or self._supervisor, session,
                                      rank=spec.rank, attempt=spec.attempt,
                                      interval_s=spec.progress_interval_s, activity=probe.sample)
        # Heartbeats start now: a rank still releasing groups or prewarming is alive, not silent.
        forwarder.start()
        try:
            self._wait_released()
            with session.lock:  # the forwarder drains events meanwhile
                session.events.append({"phase": "release_groups", "t_start": t0,
                                       "t_end": time.time(), "rank": spec.rank})
            with self._setup_lock:
                if not self._frozen:  # imports are done: keep them out of every later gc pass
                    freeze_startup_objects()
                    self._frozen = True
                startup, self._startup = self._startup, []
            with session.lock:
                session.events.extend({**e, "rank": spec.rank} for e in startup)
            self._attempt = spec.attempt
            self._uses_gpu = spec.use_gpu
            self._in_rendezvous = False
            self._interrupted.clear()
            self._ensure_checkpointer(spec)
        except Exception as exc:  # noqa: BLE001 - this rank's failure, reported like the user's
            forwarder.stop()
            return AttemptOutcome(rank=spec.rank, attempt=spec.attempt, status="failed",
                                  error=describe(exc, spec.rank, spec.attempt),
                                  failed_at=time.time())
        except BaseException:
            forwarder.stop()
            raise
        session.checkpointer = self._checkpointer
        self._session = session
        if self._checkpointer is not None:
            self._checkpointer.set_vote_relay(spec.progress_sink)
        box: dict[str, Any] = {}
        self._thread = threading.Thread(
            target=self._train_thread, args=(spec, session, box),
            name=f"rr-train-r{spec.rank}-a{spec.attempt}", daemon=True)
        self._thread.start()
        probe.watch(self._thread.ident)
        self._thread.join()
        probe.watch(None)
        metrics, step, step_time, saves, events = forwarder.stop()
        if self._checkpointer is not None:  # no reference to this attempt's model survives it
            self._checkpointer.end_attempt()
        # Groups are released in the background, overlapping the recovery; the next attempt waits.
        self._release_thread = threading.Thread(target=self._release_groups, daemon=True,
                                                name=f"rr-release-a{spec.attempt}")
        self._release_thread.start()
        self._session = None
        error = box.get("error")
        status = ("interrupted" if self._interrupted.is_set() else "failed" if error
                  else "preempted" if "preempted" in box else "finished")
        faulthandler.cancel_dump_traceback_later()  # unwound: no stacks to show (`interrupt`)
        return AttemptOutcome(
            rank=spec.rank, attempt=spec.attempt, status=status, error=error,
            failed_at=box.get("failed_at"), in_distributed=box.get("in_distributed", False),
            return_value=box.get("return"), metrics=metrics,
            last_step=step, last_step_time=step_time, checkpoint_saves=saves,
            events=events)

    def _context(self, spec: AttemptSpec) -> TrainContext:
        device = torch.device("cuda", 0) if spec.use_gpu else torch.device("cpu")
        return TrainContext(
            world_rank=spec.rank, world_size=spec.world_size, local_rank=spec.local_rank,
            local_world_size=spec.local_world_size, node_rank=spec.node_rank,
            attempt=spec.attempt, device=device, run_name=spec.run_name, run_dir=spec.run_dir)

    def _train_thread(self, spec: AttemptSpec, session: _Session, box: dict[str, Any]) -> None:
        with self._interrupt_lock:
            self._interruptible = True
        try:
            try:
                self._init_distributed(spec, session)
                _set_session(session)
                if session.faults is not None:
                    session.faults("init", None)
                try:
                    returned = self._call_user_fn()
                except PreemptionStop as stop:  # every rank saved the agreed step and left
                    box["preempted"] = stop.step
                    return
                box["return"] = None if returned is None else cloudpickle.dumps(returned)
                if self._checkpointer is not None:  # the run's last save must commit too
                    self._checkpointer.wait_idle(
                        env_float(FINAL_SAVE_TIMEOUT_ENV_VAR, DEFAULT_FINAL_SAVE_TIMEOUT_S))
            finally:
                self._close_interrupt_window()
        except BaseException as exc:  # noqa: BLE001 - every failure is reported, never lost
            self._close_interrupt_window()
            box["failed_at"] = time.time()
            box["in_distributed"] = raised_in_distributed(exc)
            box["error"] = describe(exc, spec.rank, spec.attempt)
        finally:
            _set_session(None)

    def _close_interrupt_window(self) -> None:
        """No interrupt may land after the user's code is done (it would hit our clean-up)."""
        with self._interrupt_lock:
            self._interruptible = False
            cancel_async_raise(threading.get_ident())

    def _release_groups(self) -> None:
        teardown_process_groups()
        self._aborter.reset()

    def _wait_released(self) -> None:
        if self._release_thread is not None:
            self._release_thread.join()
            self._release_thread = None

    def _call_user_fn(self) -> Any:
        if inspect.signature(self._train_fn).parameters:
            return self._train_fn(self._train_config if self._train_config is not None else {})
        return self._train_fn()

    def _init_distributed(self, spec: AttemptSpec, session: _Session) -> None:
        os.environ.update({
            "RANK": str(spec.rank), "WORLD_SIZE": str(spec.world_size),
            "LOCAL_RANK": str(spec.local_rank), "LOCAL_WORLD_SIZE": str(spec.local_world_size),
            "GROUP_RANK": str(spec.node_rank), "NODE_RANK": str(spec.node_rank),
            "MASTER_ADDR": spec.master_addr, "MASTER_PORT": str(spec.master_port),
        })
        if spec.use_gpu:
            torch.cuda.set_device(0)  # Ray sets CUDA_VISIBLE_DEVICES to this rank's GPU

        t0 = time.time()
        self._in_rendezvous = True
        self._aborter.snapshot_before_init(store_port=spec.master_port)
        if spec.rank != 0:
            _wait_listening(spec.master_addr, spec.master_port, spec.rendezvous_timeout_s)
        # Our own store: a short rendezvous timeout, while collectives keep the long backstop.
        store = dist.TCPStore(
            spec.master_addr, spec.master_port, spec.world_size, is_master=spec.rank == 0,
            timeout=datetime.timedelta(seconds=spec.rendezvous_timeout_s),
            wait_for_workers=False)
        dist.init_process_group(
            backend=spec.backend, store=store, rank=spec.rank, world_size=spec.world_size,
            timeout=datetime.timedelta(seconds=spec.process_group_timeout_s))
        self._aborter.mark_initialized()
        self._in_rendezvous = False
        with session.lock:
            session.events.append({"phase": "init_process_group", "t_start": t0,
                                   "t_end": time.time(), "rank": spec.rank})

    def _fault_hook(self, spec: AttemptSpec) -> Callable[[str, int | None], None] | None:
        """Fires this rank's injected faults at their phase and step, each once (init and
        checkpoint_load faults hit the first attempt launched after the run reached the step)."""
        faults = list(spec.faults)
        if not faults:
            return None

        def due(fault: Any, phase: str, step: int | None) -> bool:
            if fault.phase != phase or fault.id in self._fired:
                return False
            if phase == "init":
                return fault.step <= spec.resume_hint + 1
            if phase == "checkpoint_load":
                return 0 < fault.step <= spec.resume_hint
            return step is not None and fault.step == step

        def fire_due(phase: str, step: int | None) -> None:
            for fault in faults:
                if due(fault, phase, step):
                    self._fired.add(fault.id)
                    self._record_fault(spec, fault, step if step is not None else spec.resume_hint)
                    fire(fault)

        return fire_due

    def _record_fault(self, spec: AttemptSpec, fault: Any, step: int) -> None:
        """Synchronously tells the supervisor before firing: a SIGKILL loses anything unsent."""
        ray.get(self._supervisor.fault_fired.remote(
            fault.id, {"rank": spec.rank, "attempt": spec.attempt, "t": time.time(),
                       "step": step, "kind": fault.kind.value}), timeout=30)

    def _ensure_checkpointer(self, spec: AttemptSpec) -> None:
        """One checkpointer per process, rebuilt only when the writer or the rank changed."""
        new = spec.checkpoint_spec
        current = self._checkpointer
        if new is None or (current is not None and current.spec.writer_id == new.writer_id
                           and current.rank == spec.rank and current.world_size == spec.world_size):
            return
        if current is not None:
            current.close()

        # The writer takes each snapshot from this actor (`export_snapshot`): it owns them then.
        self._checkpointer = RankCheckpointer(spec.checkpoint_spec, rank=spec.rank,
                                              world_size=spec.world_size,
                                              ranks_on_node=spec.local_world_size,
                                              exporter=ray.get_runtime_context().current_actor)

    def shutdown(self) -> None:
        """Releases what the rank holds; the actor is killed right after."""
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None
        self._wait_released()


def _warm_fsdp(port: int) -> None:
    """One FSDP2 step and one memory-tier restore on a private single-rank gloo group, then
    everything released; runs only while no attempt runs here (it uses the default group)."""
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415 - the warm-up's imports


    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
        fully_shard(model[0])
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters())
        model(torch.ones(2, 8)).sum().backward()
        optimizer.step()
        warm_restore_path(model, optimizer)
        del model, optimizer
    finally:
        teardown_process_groups(count_meshes=False)
