"""torchrun --max-restarts: torch elastic, the launcher Ray's process model replaces.

The agent polls its worker processes (every `--monitor-interval`, 0.1 s, torch's default); when
one exits non-zero it kills the others and starts the whole group again, up to `--max-restarts`
times. Each restart is new processes: interpreter, torch import, rendezvous, checkpoint load.
It has no heartbeat, so a hung rank is only noticed when a collective times out (the process
group timeout, 30 minutes by default): hang faults are skipped, not waited for.
"""

from __future__ import annotations

import re

from ray_resilience.testing import FaultKind

from .launcher import elastic_args, run_launcher, tool, worker_module
from .spec import PeerRun, Workload

#: torch elastic's log lines when a worker failed and the group is restarted (E/W/I glog-style).
DETECT = re.compile(r"elastic.*(failed \(exitcode|Worker group FAILED|restarting worker)",
                    re.IGNORECASE)


class TorchrunPeer:
    """`torchrun --standalone --nproc-per-node W --max-restarts N -m peers.elastic_worker`."""

    name = "torchrun"
    supported_kinds = frozenset({FaultKind.EXCEPTION, FaultKind.SIGKILL, FaultKind.OOM})

    def __init__(self, *, timeout_s: float = 900.0) -> None:
        self.timeout_s = timeout_s

    def available(self) -> str | None:
        """None when it can run here, else why not."""
        return None if tool("torchrun") else "torchrun is not installed in this environment"

    def run(self, workload: Workload) -> PeerRun:
        command = [tool("torchrun") or "torchrun",
                   *elastic_args(workload, max_restarts=len(workload.fault_plan) + 1),
                   *worker_module(workload)]
        return run_launcher(
            self.name, command, workload, detect=DETECT, timeout_s=self.timeout_s,
            notes=["detect = torch elastic agent's first failure log line after the fault"])
