"""Run a torch-elastic style launcher (torchrun, ft_launcher) as a child process and watch it.

The launcher's own log is the only place where it says that it noticed a failure, so its output
is read line by line on a thread, each line stamped with `time.time()` on arrival (pipe latency is
well under a millisecond here), kept in `<run_dir>/launcher.log`, and lines that announce a
failure become `detect` events. The launcher runs in its own session so a timed-out run can be
ended as a whole group: ours, by its id, never by name.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO

from .events import EventLog
from .spec import FINAL_PARAMS_FILE, PeerRun, Workload
from .timeline import build_timeline

BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: What worker processes need first on PYTHONPATH: jobs/bench (`harness`, `peers`) and the
#: checkout holding it, so they import this checkout's `ray_resilience`, not an installed one.
BENCH_PATHS = [BENCH_DIR, os.path.dirname(os.path.dirname(BENCH_DIR))]


def with_bench_paths(pythonpath: str) -> str:
    """`pythonpath` with BENCH_PATHS in front (no duplicates)."""
    paths = BENCH_PATHS + [p for p in pythonpath.split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys(paths))


NODE_LOSS_UNSUPPORTED = ("a node of a launcher job is a host running its own launcher agent; "
                         "replacing a lost host is the scheduler's job (Slurm, Kubernetes), "
                         "which this single-machine harness does not simulate")


def child_env() -> dict[str, str]:
    """Environment for launched ranks: `peers` importable, unbuffered output, one thread."""
    env = dict(os.environ)
    env["PYTHONPATH"] = with_bench_paths(env.get("PYTHONPATH", ""))
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def tool(name: str) -> str | None:
    """Path of a console script of this interpreter's environment (torchrun, ft_launcher)."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    return path if os.access(path, os.X_OK) else None


def _pump(stream: IO[str], log_path: str, events: EventLog, source: str,
          detect: Callable[[str], object]) -> None:
    with open(log_path, "a", encoding="utf-8") as out:
        for line in iter(stream.readline, ""):
            t = time.time()
            out.write(f"{t:.3f} {line}")
            out.flush()
            if detect(line):
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


@dataclasses.dataclass
class Logged:
    """A child process whose output is being stamped and saved by a pump thread."""

    name: str
    proc: subprocess.Popen
    pump: threading.Thread


def start_logged(name: str, command: Sequence[str], workload: Workload, *,
                 detect: Callable[[str], object] | None,
                 env: dict[str, str] | None = None) -> Logged:
    """Start `command` in its own session with output to `<run_dir>/<name>.log`; lines for
    which `detect(line)` is true (e.g. a compiled regex's `search`) become `detect` events."""
    proc = subprocess.Popen(
        list(command), cwd=workload.run_dir, env=env or child_env(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
    pump = threading.Thread(
        target=_pump, daemon=True, name=f"{name}-log",
        args=(proc.stdout, os.path.join(workload.run_dir, f"{name}.log"),
              EventLog(workload.run_dir, name), name, detect or (lambda _line: False)))
    pump.start()
    return Logged(name=name, proc=proc, pump=pump)


def wait_all(children: Sequence[Logged], timeout_s: float, *,
             first_success_ends: bool = False) -> tuple[list[int | None], str | None]:
    """Wait for every child under one deadline; on timeout (or Ctrl-C) kill them all, trees
    included. With `first_success_ends`, the first child to exit 0 ends the job and the others
    are stopped (torchft: the job is done when a live replica reaches the last step).
    Returns (exit codes, None for a child that was stopped; error or None)."""
    deadline, error = time.monotonic() + timeout_s, None
    try:
        while any(c.proc.poll() is None for c in children):
            if first_success_ends and any(c.proc.poll() == 0 for c in children):
                break
            if time.monotonic() > deadline:
                error = f"timed out after {timeout_s:.0f} s (see the *.log files in the run folder)"
                break
            time.sleep(0.1)
    except BaseException:  # Ctrl-C of the benchmark: leave no ranks behind
        stop(children)
        raise
    codes = [c.proc.poll() for c in children]
    stop(children)
    for child in children:
        child.pump.join(timeout=10)
    return codes, error


def stop(children: Sequence[Logged]) -> None:
    """Kill whatever of `children` still runs (a lighthouse, a launcher after a timeout)."""
    for child in children:
        if child.proc.poll() is None:
            _kill_tree(child.proc.pid)
            child.proc.wait()


def collect(run: PeerRun, workload: Workload, t_start: float) -> PeerRun:
    """Fill in the timeline (from the ranks' event logs); a run whose rank 0 never wrote the
    final parameters failed."""
    run.timeline, observed = build_timeline(
        workload.run_dir, world_size=workload.world_size, t_start=t_start)
    run.notes.extend(observed)
    if run.status == "ok" and not os.path.exists(os.path.join(workload.run_dir, FINAL_PARAMS_FILE)):
        run.status, run.error = "failed", "rank 0 never wrote the final parameters"
    return run


def run_launcher(
    mechanism: str, command: Sequence[str], workload: Workload, *,
    detect: re.Pattern[str], timeout_s: float, notes: Sequence[str] = (),
) -> PeerRun:
    """Start `command`, wait for it (at most `timeout_s`), and convert what the ranks logged.

    The run counts as ok when the launcher exited 0 and rank 0 wrote the final parameters.
    """
    workload.write()
    run = PeerRun(mechanism=mechanism, run_dir=workload.run_dir, notes=list(notes))
    t_start = time.time()
    launcher = start_logged("launcher", command, workload, detect=detect.search)
    (returncode,), error = wait_all([launcher], timeout_s)
    if error is not None or returncode != 0:
        run.status = "failed"
        run.error = error or (f"launcher exited with {returncode}; "
                              f"see {workload.run_dir}/launcher.log")
    return collect(run, workload, t_start)


def elastic_args(workload: Workload, max_restarts: int) -> list[str]:
    """The torchrun-compatible arguments both launchers take: one node, `world_size` ranks,
    `max_restarts` group restarts, and torch's default 0.1 s worker polling."""
    return ["--standalone", "--nnodes", "1", "--nproc-per-node", str(workload.world_size),
            "--max-restarts", str(max_restarts), "--monitor-interval", "0.1"]


def worker_module(workload: Workload, *extra: str) -> list[str]:
    """`-m peers.elastic_worker RUN/workload.json [extra...]`: what each launched rank runs."""
    return ["-m", "peers.elastic_worker", os.path.join(workload.run_dir, "workload.json"),
            *extra]
