"""Run a torch-elastic style launcher (torchrun, ft_launcher) as a child process and watch it.

The launcher's own log is the only place where it says that it noticed a failure, so its output
is read line by line on a thread, each line stamped with `time.time()` on arrival (pipe latency is
well under a millisecond here), kept in `<run_dir>/launcher.log`, and lines that announce a
failure become `detect` events. The launcher runs in its own session so a timed-out run can be
ended as a whole group: ours, by its id, never by name.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from .events import EventLog
from .spec import PeerRun, Workload
from .timeline import build_timeline
from .workload import read_final_params

JOBS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_env() -> dict[str, str]:
    """Environment for launched ranks: `peers` importable, unbuffered output, one thread."""
    env = dict(os.environ)
    paths = [JOBS_DIR] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def tool(name: str) -> str | None:
    """Path of a console script of this interpreter's environment (torchrun, ft_launcher)."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    return path if os.access(path, os.X_OK) else None


def _pump(stream, log_path: str, events: EventLog, source: str,
          detect: re.Pattern[str]) -> None:
    with open(log_path, "a", encoding="utf-8") as out:
        for line in iter(stream.readline, ""):
            t = time.time()
            out.write(f"{t:.3f} {line}")
            out.flush()
            if detect.search(line):
                events.write("detect", t=t, source=source, detail=line.strip()[:300])


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc). The launchers start each rank in a session of
    its own, so killing the launcher's process group would leave the ranks running."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue  # exited meanwhile
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found.extend(kids)
        todo.extend(kids)
    return found


def _kill_tree(pid: int) -> None:
    """SIGKILL the launcher we started and everything it started, by process id."""
    for target in [pid, *_descendants(pid)]:
        try:
            os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_launcher(
    mechanism: str, command: Sequence[str], workload: Workload, *,
    detect: re.Pattern[str], timeout_s: float, notes: Sequence[str] = (),
) -> PeerRun:
    """Start `command`, wait for it (at most `timeout_s`), and convert what the ranks logged.

    The run counts as ok when the launcher exited 0 and rank 0 wrote the final parameters.
    """
    workload.write()
    run = PeerRun(mechanism=mechanism, checkpoint_interval=workload.checkpoint_interval,
                  faulty=len(workload.fault_plan) > 0, run_dir=workload.run_dir,
                  notes=list(notes))
    events = EventLog(workload.run_dir, "launcher")
    t_start = time.time()
    proc = subprocess.Popen(
        list(command), cwd=workload.run_dir, env=child_env(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
    pump = threading.Thread(
        target=_pump, daemon=True, name=f"{mechanism}-log",
        args=(proc.stdout, os.path.join(workload.run_dir, "launcher.log"), events, mechanism,
              detect))
    pump.start()
    try:
        returncode = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        returncode = proc.wait()
        run.error = f"timed out after {timeout_s:.0f} s (see {workload.run_dir}/launcher.log)"
    except BaseException:  # Ctrl-C of the benchmark: leave no ranks behind
        _kill_tree(proc.pid)
        raise
    pump.join(timeout=10)
    run.timeline, observed = build_timeline(
        workload.run_dir, world_size=workload.world_size, t_start=t_start)
    run.notes.extend(observed)
    run.final_params = read_final_params(workload.run_dir)
    if returncode != 0 or run.final_params is None:
        run.status = "failed"
        run.error = run.error or (
            f"launcher exited with {returncode}; see {workload.run_dir}/launcher.log")
    return run


def elastic_args(workload: Workload, max_restarts: int) -> list[str]:
    """The torchrun-compatible arguments both launchers take, then the worker module."""
    return ["--standalone", "--nnodes", "1", "--nproc-per-node", str(workload.world_size),
            "--max-restarts", str(max_restarts), "--monitor-interval", "0.1"]


def worker_module(workload: Workload, *extra: str) -> list[str]:
    return ["-m", "peers.elastic_worker", os.path.join(workload.run_dir, "workload.json"),
            *extra]
