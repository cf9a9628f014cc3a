"""Runs one mechanism on one workload in a process of its own, and charges it.

    python -m sweep.runner REQUEST.json RESULT.json

The sweep starts one runner per run: a crash or a leaked process cannot affect the next run,
every run gets a fresh private Ray, and `resources.Meter` charges the run every process it
started. The result is plain JSON: status, error, notes, timeline, usage.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import traceback
from typing import Any

from harness.resources import Meter, become_subreaper
from harness.spec import PeerRun, Workload
from peers import make_peer

#: Every process the run started, its role and its CPU and memory over time (`Meter`).
PROCESSES_FILE = "processes.json"


def run_request(request: dict[str, Any]) -> dict[str, Any]:
    workload = Workload.from_json(request["workload"])
    peer = make_peer(request["mechanism"], timeout_s=request["timeout_s"])
    become_subreaper()
    if workload.local_root:  # a tmpfs folder of this run's own: ours checks it exists
        os.makedirs(workload.local_root, mode=0o700, exist_ok=True)
    meter = Meter()
    meter.start()
    try:
        run = peer.run(workload)
    except Exception as exc:  # noqa: BLE001 - the row says failed, with the traceback saved
        with open(os.path.join(workload.run_dir, "error.txt"), "w", encoding="utf-8") as f:
            f.write(traceback.format_exc())
        run = PeerRun(mechanism=peer.name, status="failed", error=f"{type(exc).__name__}: {exc}",
                      run_dir=workload.run_dir)
    usage = meter.stop()
    with open(os.path.join(workload.run_dir, PROCESSES_FILE), "w", encoding="utf-8") as f:
        json.dump(meter.processes, f)
    if workload.local_root:
        shutil.rmtree(workload.local_root, ignore_errors=True)
    return {"mechanism": run.mechanism, "status": run.status, "error": run.error,
            "notes": run.notes, "timeline": run.timeline.to_dict() if run.timeline else None,
            "usage": {"peak_rss_bytes": usage.peak_rss_bytes,
                      "peak_memory_bytes": usage.peak_memory_bytes, "cpu_s": usage.cpu_s,
                      "num_processes": usage.num_processes}, "finished_at": time.time()}


def main(argv: list[str]) -> int:
    request_path, result_path = argv
    with open(request_path, encoding="utf-8") as f:
        result = run_request(json.load(f))
    with open(f"{result_path}.tmp", "w", encoding="utf-8") as f:
        json.dump(result, f)
    os.replace(f"{result_path}.tmp", result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
