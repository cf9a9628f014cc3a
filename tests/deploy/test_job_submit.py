"""`ray job submit` end to end, against a real local Ray head that this module starts and stops.

The head's job API (the dashboard) listens on 127.0.0.1 only; the head has a private temp dir,
private ports and its own auth token (GCS and raylet bind the node's IP: Ray 2.60 maps a loopback
--node-ip-address to it, see `resolve_ip_for_localhost`), and runs in a session of its own.
It is stopped by signalling the processes of that session (and any process naming its temp
dir): `ray stop` in Ray 2.60 has no option to target one cluster and would stop every Ray on the
machine, including other test runs'. Everything goes through the `ray` CLI, as a user's would.
Needs `ray[default]`: the dashboard serves the job-submission API.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
EXCLUDES = [".venv", ".git", "runs", "results"]
HEAD_READY_S = 90.0
JOB_SUCCEEDED_S = 180.0
JOB_FAILED_S = 90.0
STOP_GRACE_S = 5.0
POLL_S = 1.0
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# (pattern, status or None for the captured word): the lines ray/dashboard/modules/job/cli.py prints
_STATUS_LINES = [
    (r"Job {job} succeeded", "SUCCEEDED"),
    (r"Job {job} failed", "FAILED"),
    (r"Job {job} was stopped", "STOPPED"),
    (r"Status for job {job}: (\w+)", None),
]


def _free_ports(count: int) -> list[int]:
    """Distinct free loopback ports (held open together so none is handed out twice)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _processes_of(session: int, marker: str) -> list[int]:
    """PIDs in `session`, or whose command line names `marker` (our temp dir); never others."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        if int(fields[3]) == session or marker in cmdline:
            found.append(int(entry))
    return found


@dataclass
class LocalHead:
    """A Ray head started by `ray start --head --block` in its own session."""

    process: subprocess.Popen[bytes]
    temp_dir: str
    address: str
    env: dict[str, str]

    def ray(self, *args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run `ray job <args> --address <this head>` with the venv's CLI."""
        command = [str(VENV_BIN / "ray"), "job", *args[:1], "--address", self.address, *args[1:]]
        return subprocess.run(
            command, env=self.env, cwd=REPO, capture_output=True, text=True, timeout=timeout_s
        )

    def status(self, job_id: str) -> str:
        """The job's status as `ray job status` prints it (terminal states get a banner)."""
        result = self.ray("status", job_id)
        out = _ANSI.sub("", result.stdout + result.stderr)
        quoted = re.escape(f"'{job_id}'")
        for pattern, status in _STATUS_LINES:
            match = re.search(pattern.format(job=quoted), out)
            if match:
                return status or match.group(1)
        return "UNKNOWN"

    def api_status(self, job_id: str) -> str:
        """The job's status from the head's job REST API (`GET /api/jobs/<id>`), which the CLI
        itself calls: polling through the CLI started a Python process importing Ray (1-2
        CPU-seconds) every few seconds on a 2-core machine whose jobs were training."""
        request = urllib.request.Request(
            f"{self.address}/api/jobs/{job_id}",
            headers={"Authorization": f"Bearer {self.env['RAY_AUTH_TOKEN']}"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return str(json.loads(response.read()).get("status", "UNKNOWN"))
        except OSError:
            return "UNKNOWN"

    def wait(self, job_id: str, timeout_s: float) -> str:
        """Poll the REST API until the job is terminal, then confirm with `ray job status` (a
        user's view); on timeout return the last status."""
        deadline, status = time.monotonic() + timeout_s, "UNKNOWN"
        while time.monotonic() < deadline:
            status = self.api_status(job_id)
            if status in TERMINAL:
                return self.status(job_id)
            time.sleep(POLL_S)
        return status

    def logs(self, job_id: str) -> str:
        result = self.ray("logs", job_id)
        return result.stdout + result.stderr

    def stop(self) -> list[int]:
        """SIGTERM the head's processes, SIGKILL what is left; return PIDs that survived."""
        for sig, grace_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
            for pid in _processes_of(self.process.pid, self.temp_dir):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + grace_s
            while _processes_of(self.process.pid, self.temp_dir) and time.monotonic() < deadline:
                self.process.poll()  # reap the `ray start` child so it does not linger as a zombie
                time.sleep(0.5)
        self.process.wait(timeout=5)
        return _processes_of(self.process.pid, self.temp_dir)


def _start_head(temp_dir: str) -> LocalHead:
    gcs, dashboard, client, agent, agent_grpc, metrics, env_agent, manager, objects = _free_ports(9)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",  # the job's `python` is the venv's
        RAY_USAGE_STATS_ENABLED="0",
        RAY_AUTH_MODE="token",  # Ray's default, with a token of our own instead of ~/.ray's
        RAY_AUTH_TOKEN=secrets.token_hex(16),
        PYTHONUNBUFFERED="1",
    )
    command = [
        str(VENV_BIN / "ray"), "start", "--head", "--block", "--port", str(gcs),
        "--temp-dir", temp_dir, "--num-cpus", "4",
        "--include-dashboard=true", "--dashboard-host", "127.0.0.1",
        "--dashboard-port", str(dashboard), "--ray-client-server-port", str(client),
        "--dashboard-agent-listen-port", str(agent), "--dashboard-agent-grpc-port", str(agent_grpc),
        "--metrics-export-port", str(metrics), "--runtime-env-agent-port", str(env_agent),
        "--node-manager-port", str(manager), "--object-manager-port", str(objects),
    ]  # fmt: skip
    log = open(os.path.join(temp_dir, "ray-start.log"), "wb")  # noqa: SIM115 - the child process owns it
    process = subprocess.Popen(
        command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    return LocalHead(process, temp_dir, f"http://127.0.0.1:{dashboard}", env)


def _wait_ready(head: LocalHead) -> None:
    deadline = time.monotonic() + HEAD_READY_S
    while time.monotonic() < deadline:
        if head.process.poll() is not None:
            break
        token = head.env["RAY_AUTH_TOKEN"]
        request = urllib.request.Request(
            f"{head.address}/api/version", headers={"Authorization": f"Bearer {token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(1.0)
    log = Path(head.temp_dir, "ray-start.log").read_text(errors="replace")[-3000:]
    code = head.process.poll()
    pytest.fail(f"Ray head not ready within {HEAD_READY_S:.0f} s (exit code {code}):\n{log}")


@pytest.fixture(scope="module")
def local_head() -> Iterator[LocalHead]:
    """A private Ray head for this module; always stopped, and checked for leftover processes."""
    pytest.importorskip("ray")
    try:
        import aiohttp  # noqa: F401, PLC0415 - the probe: ImportError is the answer
    except ImportError:
        pytest.fail("`ray job submit` needs the dashboard: pip install 'ray[default]==2.60.*'")
    temp_dir = tempfile.mkdtemp(prefix="rr-head-", dir="/tmp")  # short: Ray's socket paths
    head = _start_head(temp_dir)
    try:
        _wait_ready(head)
        yield head
    finally:
        leftover = head.stop()
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not leftover, f"Ray head processes survived the stop: {leftover}"


def _submit(head: LocalHead, job_id: str, *entrypoint: str) -> None:
    runtime_env = json.dumps({"excludes": EXCLUDES})
    result = head.ray(
        "submit", "--submission-id", job_id, "--working-dir", str(REPO),
        "--runtime-env-json", runtime_env, "--no-wait", "--", *entrypoint,
    )  # fmt: skip
    assert result.returncode == 0, f"ray job submit failed:\n{result.stdout}\n{result.stderr}"


def _committed_steps(run_dir: Path) -> list[str]:
    """Step folders holding the commit marker (see ray_resilience/checkpoint/layout.py)."""
    from ray_resilience._internal.checkpoint.format.layout import CHECKPOINTS_DIR, MANIFEST_NAME  # noqa: PLC0415 - tests/deploy run without torch

    root = run_dir / CHECKPOINTS_DIR
    return sorted(p.name for p in root.glob("step_*") if (p / MANIFEST_NAME).is_file())


@pytest.mark.timeout(360)
def test_submitted_training_job_succeeds_and_a_misconfigured_one_fails(
    local_head: LocalHead, tmp_path: Path
) -> None:
    """Two jobs on the head at once (each costs a job driver's start-up, so they overlap): one
    trains and commits checkpoints, the other has a bad setting and fails, naming it."""
    store, job_id = tmp_path / "store", f"submit-ok-{secrets.token_hex(4)}"
    bad_id = f"submit-fail-{secrets.token_hex(4)}"
    _submit(
        local_head, bad_id, "python", "jobs/train_llama_fsdp.py", "--num_workers", "0",
        "--storage_path", str(tmp_path / "bad-store"),
    )  # fmt: skip
    _submit(
        local_head, job_id, "python", "jobs/train_llama_fsdp.py", "--max_steps", "12",
        "--num_workers", "2", "--checkpoint_interval", "5", "--storage_path", str(store),
        "--run_name", "submit-test", "--quiet",
    )  # fmt: skip
    bad_status = local_head.wait(bad_id, JOB_FAILED_S)
    bad_logs = local_head.logs(bad_id)
    assert bad_status == "FAILED", f"job ended {bad_status}; logs:\n{bad_logs[-4000:]}"
    assert "num_workers" in bad_logs and "Error" in bad_logs, bad_logs[-4000:]
    status = local_head.wait(job_id, JOB_SUCCEEDED_S)
    assert status == "SUCCEEDED", f"job ended {status}; logs:\n{local_head.logs(job_id)[-4000:]}"
    run_dir = store / "submit-test"
    results = json.loads((run_dir / "results.json").read_text())
    assert results["ok"] and results["metrics"]["step"] == 12, results
    committed = _committed_steps(run_dir)
    # Saves at steps 5 and 10; both committed and kept (num_to_keep=2).
    assert [int(name.split("_")[1]) for name in committed] == [5, 10], committed
