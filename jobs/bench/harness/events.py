"""The event log every peer's training processes write, and the ledger of fired faults.

Peers are separate programs (Ray Train workers, torchrun children, the Ray Train controller),
so they cannot share a recorder object. Each process appends JSON lines to its own file under
`<run_dir>/events/`; after the run the benchmark merges the files and converts them into a
`RunTimeline` (`timeline.py`). One file per process means no two writers ever share a file, and a
line is written with a single `os.write` on an O_APPEND descriptor, so a SIGKILL can lose at most
the line being written, never corrupt an earlier one. All times are `time.time()`: every process
of every peer runs on this machine, so wall-clock time is the one clock they share.

Event kinds ("ev"): start, pg_ready, load, step, threads, save, commit, detect, done (see
`EventLog`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

from ray_resilience.testing import Fault

from .threads import snapshot

EVENTS_DIR = "events"
FAULT_LEDGER_FILE = "faults_fired.jsonl"


def _append_line(path: str, record: dict[str, Any], *, sync: bool = False) -> None:
    line = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _read_lines(path: str) -> list[dict[str, Any]]:
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # the one line a SIGKILL cut short; everything before it is intact
    return records


class EventLog:
    """Appends this process's events to `<run_dir>/events/<writer>.jsonl`.

    `writer` must be unique per process (e.g. "rank1-pid4242", "controller-pid77").
    Thread-safe: the Ray Train controller calls back from several threads.
    """

    def __init__(self, run_dir: str, writer: str) -> None:
        folder = os.path.join(run_dir, EVENTS_DIR)
        os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, f"{writer}.jsonl")
        self._lock = threading.Lock()

    def write(self, ev: str, **fields: Any) -> None:
        """Append one event; `t` defaults to now."""
        record = {"ev": ev, "t": time.time(), **fields}
        with self._lock:
            _append_line(self.path, record)

    # One helper per event kind, so the schema lives in one place.
    def start(self, rank: int, t: float) -> None:
        """The rank's process (or, under Ray Train, its train function) began at `t`."""
        self.write("start", rank=rank, pid=os.getpid(), t=t)

    def pg_ready(self, rank: int) -> None:
        """torch.distributed is initialised and the model is built on this rank."""
        self.write("pg_ready", rank=rank)

    def load(self, rank: int, t_start: float, from_step: int, tier: str | None = None) -> None:
        """Checkpoint `from_step` (0: none, fresh start) was loaded between t_start and now,
        from `tier` ("local", "storage"; None when nothing was loaded)."""
        self.write("load", rank=rank, t_start=t_start, from_step=from_step, tier=tier)

    def step(self, rank: int, step: int, loss: float) -> None:
        """This rank finished step `step` (optimizer step applied); with the CPU seconds its
        process and its calling (training) thread had used by then, for per-step CPU cost."""
        self.write("step", rank=rank, step=step, loss=loss, cpu_s=time.process_time(),
                   thread_cpu_s=time.thread_time())

    def threads(self, rank: int, step: int) -> None:
        """Every thread of this rank's process with the CPU it used so far, after `step`."""
        self.write("threads", rank=rank, step=step, threads=snapshot())

    def save(self, rank: int, step: int, blocking_s: float, *, tier: str | None = None,
             part: str | None = None) -> None:
        """The save of `step` blocked training for `blocking_s` (tier "local" for a node-local
        one; `part` names a later wait that belongs to it, e.g. the optimizer step's)."""
        self.write("save", rank=rank, step=step, blocking_s=blocking_s, tier=tier, part=part)

    def commit(self, step: int, source: str) -> None:
        """Checkpoint `step` became loadable (its marker exists / Ray Train registered it)."""
        self.write("commit", step=step, source=source)

    def detect(self, source: str, detail: str = "") -> None:
        """The mechanism noticed a failure (a launcher's log line, a controller callback)."""
        self.write("detect", source=source, detail=detail[:300])

    def done(self, rank: int, final_step: int) -> None:
        """Training ended on this rank with `final_step` completed (final params written)."""
        self.write("done", rank=rank, final_step=final_step)


def read_events(run_dir: str) -> list[dict[str, Any]]:
    """Every event of the run from every writer, sorted by time."""
    folder = os.path.join(run_dir, EVENTS_DIR)
    if not os.path.isdir(folder):
        return []
    events: list[dict[str, Any]] = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".jsonl"):
            events.extend(_read_lines(os.path.join(folder, name)))
    return sorted(events, key=lambda e: e["t"])


class FaultLedger:
    """Which faults of the plan have fired, and when: `<run_dir>/faults_fired.jsonl`.

    A restarted process re-trains steps it already trained (rollback); the ledger is how it
    knows a fault due at such a step has fired already and must not fire again. The fault's
    wall time is written (and fsynced) before it fires, because a SIGKILL leaves no chance after.
    """

    def __init__(self, run_dir: str) -> None:
        self.path = os.path.join(run_dir, FAULT_LEDGER_FILE)

    def fired_ids(self) -> set[str]:
        return {r["id"] for r in self.records()}

    def records(self) -> list[dict[str, Any]]:
        """Fired faults in firing order: id, step, rank, kind, t_fault."""
        return _read_lines(self.path) if os.path.exists(self.path) else []

    def record(self, fault: Fault) -> float:
        """Write `fault` as fired now; returns its wall time. Call immediately before firing."""
        t_fault = time.time()
        _append_line(self.path, {"id": fault.id, "step": fault.step, "rank": fault.rank,
                                 "kind": fault.kind.value, "t_fault": t_fault}, sync=True)
        return t_fault


def write_events(run_dir: str, writer: str, records: Iterable[dict[str, Any]]) -> None:
    """Append ready-made records (with their own `t`) to a writer's file; used by tests."""
    log = EventLog(run_dir, writer)
    for record in records:
        _append_line(log.path, record)
