"""Another job on the test session's Ray: a separate driver process (its own Ray job and
namespace, like a second `ray job submit`) that runs `workload.fit` and prints its outcome.

    python -m tests.support.second_driver '<json: address, data_dir, storage, name, ...>'
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STARTED = "second driver: fitting"


def launch(address: str, *, log: str, **job: Any) -> subprocess.Popen:
    """Starts the driver (stdout: STARTED, then the outcome as one JSON line; stderr: `log`)."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    with open(log, "ab") as err:
        return subprocess.Popen([sys.executable, "-m", "tests.support.second_driver",
                                 json.dumps({"address": address, **job})], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=err, text=True)


def alive(proc: subprocess.Popen, log: str) -> bool:
    """True while the driver runs; AssertionError with its log's tail once it ended."""
    if proc.poll() is None:
        return True
    with open(log, errors="replace") as f:
        tail = f.read()[-3000:]
    raise AssertionError(f"the second driver exited ({proc.returncode}):\n{tail}")


def wait_started(proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    """Returns once the driver is connected and inside `fit()`."""
    deadline = time.monotonic() + timeout_s
    line = ""
    while STARTED not in line:
        assert time.monotonic() < deadline and proc.poll() is None, "the driver did not start"
        line = proc.stdout.readline()


def outcome(proc: subprocess.Popen, timeout_s: float = 300.0) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=timeout_s)
    return json.loads(out.strip().splitlines()[-1])


def main(job: dict[str, Any]) -> dict[str, Any]:
    import ray  # noqa: PLC0415 - in the driver process only

    import ray_resilience as rr  # noqa: PLC0415 - see above
    from ray_resilience.checkpoint import CheckpointConfig  # noqa: PLC0415 - see above
    from tests.support import workload  # noqa: PLC0415 - see above

    ray.init(address=job["address"], runtime_env={"env_vars": {"PYTHONPATH": ROOT}},
             log_to_driver=False)
    checkpoint = CheckpointConfig(interval_steps=job.get("interval", 2),
                                  **job.get("checkpoint", {}))
    print(STARTED, flush=True)
    started = time.time()
    result = workload.fit(job["data_dir"], job["storage"], job["name"],
                          max_steps=job.get("max_steps", 12),
                          resilience=rr.ResilienceConfig.disabled(checkpoint=checkpoint),
                          raise_on_failure=False,  # the test reads the typed error off Result
                          **job.get("cfg", {}))
    values = [v or {} for v in result.return_values]
    return {"ok": result.ok, "error_type": type(result.error).__name__ if result.error else None,
            "error": str(result.error) if result.error else None, "started": started,
            "ended": time.time(), "worker_pids": result.worker_pids,
            "resumed_from": [v.get("resumed_from") for v in values]}


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
