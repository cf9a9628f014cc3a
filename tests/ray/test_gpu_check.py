"""jobs/gpu_check.py in its dry mode, as CI runs it without a GPU: every CUDA part says SKIP,
the others (the overlapped local snapshot, an in-process restart through `ResilientTrainer`) run
on the CPU and pass, and the JSON report records both."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.timeout(900)
def test_the_dry_run_skips_cuda_parts_and_passes_the_rest(tmp_path):
    out = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = ROOT
    done = subprocess.run([sys.executable, os.path.join(ROOT, "jobs", "gpu_check.py"),
                           "--dry-run", "--out", str(out)], capture_output=True, text=True,
                          env=env, timeout=840, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    for part in ("fsdp2_nccl", "d2h_bandwidth", "cuda_health", "at_size"):
        assert f"SKIP {part}: needs CUDA (--dry-run)" in done.stdout
    report = json.loads(out.read_text())
    parts = report["parts"]
    assert {k: v["status"] for k, v in parts.items()} == {
        "fsdp2_nccl": "skipped", "d2h_bandwidth": "skipped", "cuda_health": "skipped",
        "at_size": "skipped", "overlapped_snapshot": "passed", "inprocess_restart": "passed"}
    assert parts["inprocess_restart"]["bit_equal"] and parts["inprocess_restart"]["tier"] == "local"
    assert report["cuda"] is False and report["dry_run"] is True
