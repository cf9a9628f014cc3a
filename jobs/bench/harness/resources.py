"""What a run costs in machine resources: peak memory and CPU-seconds over all its processes.

The runner process makes itself a child subreaper (Linux `PR_SET_CHILD_SUBREAPER`), so every
process the run starts, however deep and even after its parent exits, stays its descendant. A
sampler reads every descendant every SAMPLE_S: the sum of their resident memory and each one's
CPU time, and the memory they hold: each process's private resident memory (RSS less its shared
pages) plus the machine's shared memory above what it held when the run started (`Shmem` in
/proc/meminfo: Ray's object store, tensors in shared memory, checkpoints in /dev/shm, counted
once however many processes map them). Its peak is the run's peak memory. Shared library pages
are left out (they sit in the page cache once for every process of every mechanism), and the
machine must run nothing else that grows shared memory meanwhile (the benchmark runs alone).
The plain RSS sum is kept for comparison with older results; it counts a shared page once per
process that touched it, so for Ray-hosted runs it can exceed the machine's memory. (PSS would
split shared pages exactly, but the kernel walks every page table to report it: ~60 ms of CPU
for a 3 GB rank, too much to read every second from the runs being measured.) After the run
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


@dataclasses.dataclass(frozen=True)
class Usage:
    peak_rss_bytes: int
    """Largest sum of the processes' RSS (shared pages counted once per process)."""
    peak_memory_bytes: int
    """Largest private memory of the processes plus shared memory grown since the start."""
    cpu_s: float
    """User + system CPU of every process the run started."""
    num_processes: int
    """Distinct processes seen."""


def become_subreaper() -> None:
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


class Meter:
    """Samples the calling process's descendants from `start()` until `stop()`."""

    def __init__(self) -> None:
        self._me = psutil.Process()
        self._shmem_at_start = shmem_bytes()
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

    def sample(self) -> None:
        total, private = 0, 0
        for proc in self._me.children(recursive=True):
            try:
                with proc.oneshot():
                    memory, times = proc.memory_info(), proc.cpu_times()
                    name = role(proc)
            except psutil.Error:
                continue  # exited meanwhile
            rss = memory.rss
            total += rss
            private += max(0, rss - memory.shared)
            cpu_s = times.user + times.system
            with self._lock:
                self._cpu[proc.pid] = max(self._cpu.get(proc.pid, 0.0), cpu_s)
                entry = self.processes.setdefault(proc.pid, {"role": name, "samples": []})
                if name != "ray::IDLE" and not _truncated(name, entry["role"]):
                    entry["role"] = name
                entry["samples"].append([round(time.time(), 3), cpu_s, rss])
        self._peak = max(self._peak, total)
        shared = max(0, shmem_bytes() - self._shmem_at_start)
        self._peak_memory = max(self._peak_memory, private + shared)

    def stop(self) -> Usage:
        """Stops sampling, kills what the run left behind (ours, by pid), reaps everything."""
        self._stop.set()
        self._thread.join()
        self.sample()
        for pid, cpu_s in _kill_and_reap(self._me).items():
            self._cpu[pid] = max(self._cpu.get(pid, 0.0), cpu_s)
        return Usage(peak_rss_bytes=self._peak, peak_memory_bytes=self._peak_memory,
                     cpu_s=sum(self._cpu.values()), num_processes=len(self._cpu))


def shmem_bytes() -> int:
    """The machine's shared memory now (tmpfs files and shared mappings): /proc/meminfo Shmem."""
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) * 1024
    return 0


_COMM_MAX = 15
"""The kernel's limit on a process name (`comm`): what `role` falls back to when a process that
is exiting no longer shows its command line ("ray::WorkerActo")."""


def _truncated(name: str, known: str) -> bool:
    return len(name) == _COMM_MAX and known.startswith(name) and known != name


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
