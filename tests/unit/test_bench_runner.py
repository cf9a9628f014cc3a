"""The benchmark runner gives each run a private folder in node-local shared memory (ours
refuses a `local_dir` that does not exist) and removes it after the run, whatever the run did."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                     "jobs", "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

from harness.resources import Usage  # noqa: E402
from harness.spec import PeerRun, Workload  # noqa: E402
from sweep import runner  # noqa: E402

pytestmark = pytest.mark.timeout(60)


class _Peer:
    name = "probe"

    def __init__(self) -> None:
        self.seen: tuple[bool, int] | None = None

    def run(self, workload: Workload) -> PeerRun:
        mode = os.stat(workload.local_root).st_mode
        self.seen = (stat.S_ISDIR(mode), stat.S_IMODE(mode))
        return PeerRun(mechanism=self.name, run_dir=workload.run_dir)


class _NoMeter:
    """The runner's meter kills every descendant of its process when it stops: in the test
    process those are the session's S3 server and Ray, never a run's."""

    processes: dict = {}

    def start(self) -> None:
        pass

    def stop(self) -> Usage:
        return Usage(peak_rss_bytes=0, peak_memory_bytes=0, cpu_s=0.0, num_processes=0)


def test_each_run_gets_a_private_local_folder_removed_after_it(tmp_path, monkeypatch) -> None:
    peer = _Peer()
    monkeypatch.setattr(runner, "make_peer", lambda name, timeout_s: peer)
    monkeypatch.setattr(runner, "become_subreaper", lambda: None)  # not the test process
    monkeypatch.setattr(runner, "Meter", _NoMeter)
    local_root = tmp_path / "shm" / "rrbench-run"  # missing: the runner creates it
    workload = Workload(data_dir=str(tmp_path / "data"), run_dir=str(tmp_path / "run"),
                        local_root=str(local_root))
    workload.write()
    result = runner.run_request({"workload": workload.to_json(), "mechanism": "probe",
                                 "timeout_s": 30.0})
    assert result["status"] == "ok", result
    assert peer.seen == (True, 0o700)
    assert not local_root.exists()


def test_peak_memory_counts_private_memory_and_new_shared_memory_once(tmp_path) -> None:
    from harness.resources import Meter  # noqa: PLC0415

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    shm = f"/dev/shm/rr-meter-test-{os.getpid()}"
    try:
        meter = Meter()
        meter.sample()  # never stop(): it would kill every descendant of the test process
        before = meter._peak_memory
        assert child.pid in meter.processes and 0 < before <= meter._peak
        with open(shm, "wb") as f:  # 64 MiB in tmpfs, mapped by no process
            f.write(b"\1" * (64 << 20))
        meter.sample()
        assert meter._peak_memory >= before + (60 << 20)
    finally:
        child.kill()
        child.wait(10)
        if os.path.exists(shm):
            os.unlink(shm)


def test_a_process_keeps_its_full_role_once_only_its_truncated_name_shows(monkeypatch) -> None:
    """An exiting process loses its command line and `role` falls back to the kernel's 15-character
    name: the table must not list it apart from its siblings ("ray::WorkerActo")."""
    from harness import resources  # noqa: PLC0415

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        meter = resources.Meter()
        seen = []
        for name in ["ray::WorkerActor", "ray::WorkerActo", "ray::IDLE", "ray::Supervisor"]:
            monkeypatch.setattr(resources, "role", lambda proc, name=name: name)
            meter.sample()  # never stop(): it would kill every descendant of the test process
            seen.append(meter.processes[child.pid]["role"])
        assert seen == ["ray::WorkerActor", "ray::WorkerActor", "ray::WorkerActor",
                        "ray::Supervisor"]
    finally:
        child.kill()
        child.wait(10)


def test_a_run_from_another_checkout_imports_that_checkouts_code(tmp_path, monkeypatch) -> None:
    """`--checkout LABEL=PATH` arms: the runner must import PATH's ray_resilience even when the
    benchmark is started from this checkout's root (`-m` would put the working directory first)."""
    from sweep.isolated import run_isolated  # noqa: PLC0415

    other = tmp_path / "other"
    (other / "ray_resilience").mkdir(parents=True)
    (other / "ray_resilience" / "__init__.py").write_text("")
    runner_dir = other / "jobs" / "bench" / "sweep"
    runner_dir.mkdir(parents=True)
    (runner_dir / "__init__.py").write_text("")
    (runner_dir / "runner.py").write_text(
        "import json, sys\nimport ray_resilience\n"
        "json.dump({'status': 'ok', 'origin': ray_resilience.__file__}, open(sys.argv[2], 'w'))\n")
    monkeypatch.chdir(os.path.dirname(os.path.dirname(BENCH)))  # this checkout's root
    workload = Workload(run_dir=str(tmp_path / "run"), data_dir=str(tmp_path / "data"))
    result = run_isolated("ours", workload, timeout_s=30,
                          paths=[str(other / "jobs" / "bench"), str(other)])
    assert result.get("origin") == str(other / "ray_resilience" / "__init__.py"), result
