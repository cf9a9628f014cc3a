"""NVIDIA Resiliency Extension 0.4.1 `ft_launcher`: in-job restart with heartbeat monitoring.

ft_launcher is torch elastic's agent plus a rank monitor process per rank. Each rank sends
`RankMonitorClient` heartbeats (one per completed step, see `elastic_worker`); a rank that exits,
or whose heartbeats stop for longer than the timeout, is detected and every rank of the group is
restarted (restart policy "any-failed"). Its rank heartbeat timeout is the workload's detection
timeout, the one every mechanism gets; NVRx's defaults (45 minutes) are meant for large jobs.
Checkpoints are torchrun's: DCP async_save plus NVRx's node-local tier.
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

#: Longest silence before the first heartbeat of an attempt (interpreter, torch, load).
INITIAL_HEARTBEAT_TIMEOUT_S = 120.0
#: How often each rank monitor checks its rank's heartbeats.
WORKLOAD_CHECK_INTERVAL_S = 1.0

#: ft_launcher's own log lines (its torch elastic fork plus the rank monitors) on a failure.
DETECT = re.compile(
    r"(failed \(exitcode|Worker group FAILED|restarting worker|"
    r"Did not get (initial|subsequent) heartbeat|FT timeout elapsed|section timeout)",
    re.IGNORECASE)


class NvrxPeer:
    """`ft_launcher ... -m peers.elastic_worker RUN/workload.json --nvrx-heartbeats`."""

    name = "ft-launcher"
    supported_kinds = frozenset({FaultKind.EXCEPTION, FaultKind.SIGKILL, FaultKind.OOM,
                                 FaultKind.HANG, FaultKind.NATIVE_HANG})
    unsupported_reasons = {FaultKind.NODE_LOSS: NODE_LOSS_UNSUPPORTED}
    num_spares = 0
    uses_durable = True
    local_tier = True
    config = (f"rank heartbeat per step, timeout = detection timeout, checked every "
              f"{WORKLOAD_CHECK_INTERVAL_S:g} s; restart policy any-failed; {DCP_ASYNC}; "
              f"{NVRX_LOCAL}")

    def __init__(self, *, timeout_s: float = 900.0) -> None:
        self.timeout_s = timeout_s

    def available(self) -> str | None:
        if tool("ft_launcher") is None:
            return "nvidia-resiliency-ext (ft_launcher) is not installed in this environment"
        return None

    def run(self, workload: Workload) -> PeerRun:
        command = [
            tool("ft_launcher") or "ft_launcher",
            *elastic_args(workload, max_restarts=len(workload.fault_plan) + 1),
            "--ft-initial-rank-heartbeat-timeout", str(INITIAL_HEARTBEAT_TIMEOUT_S),
            "--ft-rank-heartbeat-timeout", str(workload.detect_timeout_s),
            "--ft-workload-check-interval", str(WORKLOAD_CHECK_INTERVAL_S),
            # InfiniBand NIC monitoring: there are no NICs of that kind on a CPU box.
            "--ft-enable-nic-monitor", "false",
            *worker_module(workload, "--nvrx-heartbeats"),
        ]
        return run_launcher(
            self.name, command, workload, detect=DETECT, timeout_s=self.timeout_s,
            notes=["detect = ft_launcher's first failure log line after the fault (agent or "
                   "rank monitor)"])
