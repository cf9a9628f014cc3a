"""Starting a runner (`sweep.runner`) for one run and reading back what it found."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from harness.launcher import BENCH_PATHS
from harness.spec import Workload

#: Time a runner gets beyond the run's own deadline (imports, teardown, reaping).
RUNNER_SLACK_S = 120.0


def run_isolated(mechanism: str, workload: Workload, *, timeout_s: float,
                 paths: list[str] | None = None) -> dict[str, Any]:
    """Run `mechanism` on `workload` in a runner process; the runner's result dict (a failed
    one if the runner itself died). Output goes to `<run_dir>/runner.log`. `paths`: the
    PYTHONPATH entries to put first (another checkout's `jobs/bench` and root; default this
    one's)."""
    os.makedirs(workload.run_dir, exist_ok=True)
    request = os.path.join(workload.run_dir, "request.json")
    result = os.path.join(workload.run_dir, "result.json")
    with open(request, "w", encoding="utf-8") as f:
        json.dump({"mechanism": mechanism, "workload": workload.to_json(),
                   "timeout_s": timeout_s}, f)
    first = paths or BENCH_PATHS
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in first]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*first, *rest])}
    with open(os.path.join(workload.run_dir, "runner.log"), "w", encoding="utf-8") as log:
        try:
            # In the run folder, with -P: `-m` puts the working directory first on sys.path, and
            # Ray puts the driver's on its workers' paths; from a checkout's root either imports
            # that checkout's ray_resilience instead of the one `paths` names.
            code = subprocess.run([sys.executable, "-P", "-m", "sweep.runner", request, result],
                                  cwd=workload.run_dir,
                                  env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout_s + RUNNER_SLACK_S).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    if not os.path.exists(result):
        return {"mechanism": mechanism, "status": "failed", "notes": [], "timeline": None,
                "usage": None, "error": f"runner exited with {code}; see {log.name}"}
    with open(result, encoding="utf-8") as f:
        return json.load(f)
