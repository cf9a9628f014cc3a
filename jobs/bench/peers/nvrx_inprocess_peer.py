"""NVRx in-process restart (`nvidia_resiliency_ext.inprocess.Wrapper`): listed, not run.

Its usage guide requires NCCL >= 2.26.2, and the reason is structural: the Wrapper unblocks
ranks stuck in a collective with `AbortTorchDistributed`, which looks up each process group's
backend for device "cuda" and calls `ProcessGroupNCCL.abort()`. A gloo collective blocked on a
dead peer has no such abort, and this machine's torch is a CPU build without CUDA or NCCL.
"""

from __future__ import annotations

from harness.spec import PeerRun, Workload

from ray_resilience.testing import FaultKind

REASON = ("needs CUDA and NCCL >= 2.26.2: inprocess.Wrapper aborts stuck collectives with "
          "ProcessGroupNCCL.abort() (AbortTorchDistributed); gloo has no abort and this "
          "machine's torch is a CPU build")


class NvrxInprocessPeer:
    """Always unavailable here; see REASON."""

    name = "nvrx-inprocess"
    supported_kinds = frozenset({FaultKind.EXCEPTION, FaultKind.HANG})
    num_spares = 0
    uses_durable = True
    local_tier = False
    config = "inprocess.Wrapper (not run)"

    def __init__(self, *, timeout_s: float = 900.0) -> None:
        self.timeout_s = timeout_s

    def available(self) -> str | None:
        return REASON

    def run(self, workload: Workload) -> PeerRun:
        return PeerRun(mechanism=self.name, status="unavailable", error=REASON,
                       run_dir=workload.run_dir)
