"""NVIDIA Resiliency Extension 0.4.1 `ft_launcher`: in-job restart with heartbeat monitoring.

ft_launcher is torch elastic's agent plus a rank monitor process per rank. Each rank sends
`RankMonitorClient` heartbeats (here one per completed step, see `elastic_worker`); a rank that
exits, or whose heartbeats stop for longer than the timeout, is detected and every rank of the
group is restarted (restart policy "any-failed"), so unlike torchrun it also recovers from hangs.
Checkpoints are the same sync local DCP saves as torchrun's.

The timeouts are set explicitly for this workload (a step takes well under a second, startup
with the torch import and checkpoint load a few seconds on this machine); NVRx's defaults
(45 minutes) are meant for large jobs and would make a hang cost the whole benchmark.
"""

from __future__ import annotations

import re

from ray_resilience.testing import FaultKind

from .launcher import elastic_args, run_launcher, tool, worker_module
from .spec import PeerRun, Workload

#: Longest silence before the first heartbeat of an attempt (interpreter, torch, load).
INITIAL_HEARTBEAT_TIMEOUT_S = 60.0
#: Longest silence between two heartbeats once training runs (a step plus a save, with slack).
HEARTBEAT_TIMEOUT_S = 5.0
#: How often each rank monitor checks its rank's heartbeats.
WORKLOAD_CHECK_INTERVAL_S = 1.0

#: ft_launcher's own log lines (its torch elastic fork plus the rank monitors) on a failure.
DETECT = re.compile(
    r"(failed \(exitcode|Worker group FAILED|restarting worker|"
    r"Did not get (initial|subsequent) heartbeat|FT timeout elapsed|section timeout)",
    re.IGNORECASE)


class NvrxPeer:
    """`ft_launcher ... -m peers.elastic_worker RUN/workload.json --nvrx-heartbeats`."""

    name = "nvrx-ft-launcher"
    supported_kinds = frozenset({FaultKind.EXCEPTION, FaultKind.SIGKILL, FaultKind.OOM,
                                 FaultKind.HANG, FaultKind.NATIVE_HANG})

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
            "--ft-rank-heartbeat-timeout", str(HEARTBEAT_TIMEOUT_S),
            "--ft-workload-check-interval", str(WORKLOAD_CHECK_INTERVAL_S),
            # InfiniBand NIC monitoring: there are no NICs of that kind on a CPU box.
            "--ft-enable-nic-monitor", "false",
            *worker_module(workload, "--nvrx-heartbeats"),
        ]
        return run_launcher(
            self.name, command, workload, detect=DETECT, timeout_s=self.timeout_s,
            notes=[("detect = ft_launcher's first failure log line after the fault (agent or "
                    f"rank monitor); heartbeat timeout {HEARTBEAT_TIMEOUT_S:g} s, checked every "
                    f"{WORKLOAD_CHECK_INTERVAL_S:g} s")])
