"""torchrun --max-restarts: torch elastic, the launcher Ray's process model replaces.

The agent polls its worker processes (every `--monitor-interval`, 0.1 s); when one exits
non-zero it kills the others and starts the whole group again, up to `--max-restarts` times.
Each restart is new processes: interpreter, torch import, rendezvous, checkpoint load. It has
no heartbeat: a hung rank is noticed when its peer's collective times out, so the process-group
timeout is set to the workload's detection timeout (torch's default is 30 minutes).
Checkpoints: DCP async_save in its fastest CPU configuration plus NVRx's node-local tier
(`harness.tiers`), each at the interval its measured cost calls for.
"""

from __future__ import annotations

import re

from harness.dcp_io import DESCRIPTION as DCP_ASYNC
from harness.launcher import (
    NODE_LOSS_UNSUPPORTED,
    elastic_args,
    run_launcher,
    tool,
    worker_module,
)
from harness.nvrx_local import DESCRIPTION as NVRX_LOCAL
from harness.spec import PeerRun, Workload

from ray_resilience.testing import FaultKind

#: torch elastic's log lines when a worker failed and the group is restarted (E/W/I glog-style).
DETECT = re.compile(r"elastic.*(failed \(exitcode|Worker group FAILED|restarting worker)",
                    re.IGNORECASE)


class TorchrunPeer:
    """`torchrun --standalone --nproc-per-node W --max-restarts N -m peers.elastic_worker`."""

    name = "torchrun"
    supported_kinds = frozenset({FaultKind.EXCEPTION, FaultKind.SIGKILL, FaultKind.OOM,
                                 FaultKind.HANG})
    unsupported_reasons = {FaultKind.NODE_LOSS: NODE_LOSS_UNSUPPORTED}
    num_spares = 0
    uses_durable = True
    local_tier = True
    config = (f"--monitor-interval 0.1; gloo timeout = detection timeout; {DCP_ASYNC}; "
              f"{NVRX_LOCAL}")

    def __init__(self, *, name: str = "torchrun", timeout_s: float = 900.0) -> None:
        self.name, self.timeout_s = name, timeout_s

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
