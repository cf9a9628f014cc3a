"""What a run costs in machine resources: peak memory and CPU-seconds over all its processes.

The runner process makes itself a child subreaper (Linux `PR_SET_CHILD_SUBREAPER`), so every
process the run starts, however deep and even after its parent exits, stays its descendant. A
sampler reads every descendant every SAMPLE_S: the sum of their resident memory and each one's
CPU time; every PSS_EVERY samples also their proportional set size (PSS) plus the bytes of the
run's own tmpfs files. Peak memory is the largest PSS + tmpfs total: a page that processes share
(Ray's object store, shared libraries, a tensor in shared memory) counts once, split over them,
and a checkpoint kept in /dev/shm counts though no process maps it. The RSS sum is kept for
comparison with older results; it counts a shared page once per process that touched it, so
for Ray-hosted runs it can exceed the machine's memory. After the run
the runner kills what is left and reaps it; a process it reaps itself gets its exact CPU time
from `wait4`. Ray's raylet reaps its workers itself without keeping their usage, so for those
the last sample stands: a process loses at most one sampling period of CPU time.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import threading
import time

import psutil

PR_SET_CHILD_SUBREAPER = 36
SAMPLE_S = 0.2
PSS_EVERY = 5
"""Samples between two PSS readings (1 s): the kernel walks a process's page tables for it, so
reading a multi-GB process five times a second would take CPU from the run it measures."""


@dataclasses.dataclass(frozen=True)
class Usage:
    peak_rss_bytes: int
    """Largest sum of the processes' RSS (shared pages counted once per process)."""
    peak_memory_bytes: int
    """Largest sum of the processes' PSS plus the run's tmpfs files (each page counted once)."""
    cpu_s: float
    """User + system CPU of every process the run started."""
    num_processes: int
    """Distinct processes seen."""


def become_subreaper() -> None:
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


class Meter:
    """Samples the calling process's descendants from `start()` until `stop()`."""

    def __init__(self, tmpfs: tuple[str, ...] = ()) -> None:
        self._me = psutil.Process()
        self._tmpfs = tmpfs
        """Folders of this run in memory-backed file systems (its local checkpoints)."""
        self._samples = 0
        self._peak_memory = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-meter", daemon=True)
        self._peak = 0
        self._cpu: dict[int, float] = {}
        self._lock = threading.Lock()
        self.processes: dict[int, dict] = {}
        """pid -> {"role": latest `role`, "samples": [[time, CPU seconds, RSS bytes], ...]}."""

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.sample()

    def sample(self, *, memory: bool = False) -> None:
        """One reading; with `memory` (and every PSS_EVERY calls) PSS and tmpfs too."""
        self._samples += 1
        memory = memory or self._samples % PSS_EVERY == 1
        total, pss = 0, 0
        for proc in self._me.children(recursive=True):
            try:
                with proc.oneshot():
                    rss, times = proc.memory_info().rss, proc.cpu_times()
                    name = role(proc)
                if memory:
                    pss += proc.memory_full_info().pss
            except psutil.Error:
                continue  # exited meanwhile
            total += rss
            cpu_s = times.user + times.system
            with self._lock:
                self._cpu[proc.pid] = max(self._cpu.get(proc.pid, 0.0), cpu_s)
                entry = self.processes.setdefault(proc.pid, {"role": name, "samples": []})
                entry["role"] = name if name != "ray::IDLE" else entry["role"]
                entry["samples"].append([round(time.time(), 3), cpu_s, rss])
        self._peak = max(self._peak, total)
        if memory:
            self._peak_memory = max(self._peak_memory,
                                    pss + sum(tree_bytes(path) for path in self._tmpfs))

    def stop(self) -> Usage:
        """Stops sampling, kills what the run left behind (ours, by pid), reaps everything."""
        self._stop.set()
        self._thread.join()
        self.sample(memory=True)
        for pid, cpu_s in _kill_and_reap(self._me).items():
            self._cpu[pid] = max(self._cpu.get(pid, 0.0), cpu_s)
        return Usage(peak_rss_bytes=self._peak, peak_memory_bytes=self._peak_memory,
                     cpu_s=sum(self._cpu.values()), num_processes=len(self._cpu))


def tree_bytes(path: str) -> int:
    """Bytes the files under `path` occupy (allocated blocks; 0 if it does not exist)."""
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                continue  # removed meanwhile
    return total


def role(proc: psutil.Process) -> str:
    """What a process is: Ray's title for its workers ("ray::WorkerActor", "ray::IDLE"), the
    script or module a Python process runs, else the executable's name."""
    args = proc.cmdline()
    if args and args[0].startswith("ray::"):
        return args[0].split(".", 1)[0].split(" ", 1)[0]
    for i, arg in enumerate(args[1:], 1):
        if arg == "-m" and i + 1 < len(args):
            return args[i + 1]
        if arg.endswith(".py"):
            return os.path.basename(arg)
    return proc.name()


def _kill_and_reap(me: psutil.Process, timeout_s: float = 30.0) -> dict[int, float]:
    """SIGKILL every descendant (repeatedly: a dying parent hands its children to us) and
    reap them all; returns pid -> CPU seconds of each process reaped here."""
    reaped: dict[int, float] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = me.children(recursive=True)
        for proc in left:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.Error:
                pass
        reaped.update(_reap_exited())
        if not left:
            break
        time.sleep(0.05)
    return reaped


def _reap_exited() -> dict[int, float]:
    reaped = {}
    while True:
        try:
            pid, _, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped[pid] = usage.ru_utime + usage.ru_stime
