"""torchft 0.2.0: per-step quorum through a lighthouse; survivors keep training, the failed
replica is restarted by its own launcher and heals from a live peer.

Deployment as torchft documents it, scaled to this machine: one `torchft_lighthouse`, and one
`torchrun --max-restarts` per replica group (here one rank each), all started by this runner.
Detection is the lighthouse's heartbeat timeout (the replica's manager stops heartbeating) or,
sooner, the survivor's failed allreduce; the survivor goes on alone, so "recovery" (fault to the
next completed step) measures how long training stalled, while the full world is back only when
the restarted replica has healed. Redone steps are at most the one in flight.

Not comparable bit for bit: while a replica is down the survivor trains on its half of the global
batch only (that is torchft's design), so the final parameters differ from a fault-free run.
"""

from __future__ import annotations

import os
import re
import socket
import time

from ray_resilience.testing import FaultKind

from .launcher import child_env, collect, start_logged, stop, tool, wait_all
from .spec import PeerRun, Workload

#: The lighthouse drops a replica whose manager has not heartbeated for this long.
HEARTBEAT_TIMEOUT_MS = 2000
#: How long a quorum waits for stragglers that heartbeat but have not joined yet: long enough
#: for both replicas to be in the first quorum (torch import and model build take seconds).
JOIN_TIMEOUT_MS = 30000

NOTE_NO_CHECKPOINTS = ("replicated model (manager allreduce), no storage checkpoints: a restarted "
                       "replica heals from a live peer")
NOTE_NOT_BIT_EQUAL = ("survivors train on their share of the batch while a replica is down, so "
                      "final parameters are not expected to be bit-equal")

_QUORUM_ID = re.compile(r"quorum_id: (\d+)")


class QuorumChange:
    """Detection for torchft: the survivor's manager logs every step's quorum; the first line
    with a new quorum id after a fault is when the lighthouse dropped the dead replica."""

    def __init__(self) -> None:
        self.last: str | None = None

    def __call__(self, line: str) -> bool:
        match = _QUORUM_ID.search(line)
        if match is None:
            return False
        changed = self.last is not None and match.group(1) != self.last
        self.last = match.group(1)
        return changed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TorchftPeer:
    """Lighthouse + one `torchrun -m peers.torchft_worker --replica r` per rank."""

    name = "torchft"
    uses_checkpoints = False  # a restarted replica heals from a live peer, not from storage
    supported_kinds = frozenset({FaultKind.EXCEPTION, FaultKind.SIGKILL, FaultKind.OOM})

    def __init__(self, *, timeout_s: float = 900.0) -> None:
        self.timeout_s = timeout_s

    def available(self) -> str | None:
        try:
            import torchft  # noqa: F401, PLC0415 - the probe: ImportError is the answer
        except ImportError as exc:
            return f"torchft is not installed: {exc}"
        if tool("torchft_lighthouse") is None or tool("torchrun") is None:
            return "torchft_lighthouse or torchrun is missing from this environment"
        return None

    def run(self, workload: Workload) -> PeerRun:
        workload.write()
        run = PeerRun(mechanism=self.name, checkpoint_interval=workload.checkpoint_interval,
                      faulty=len(workload.fault_plan) > 0, run_dir=workload.run_dir,
                      notes=[NOTE_NO_CHECKPOINTS, NOTE_NOT_BIT_EQUAL])
        port = _free_port()
        lighthouse = start_logged("lighthouse", [
            tool("torchft_lighthouse") or "torchft_lighthouse", "--min_replicas", "1",
            "--bind", f"127.0.0.1:{port}", "--quorum_tick_ms", "100",
            "--join_timeout_ms", str(JOIN_TIMEOUT_MS),
            "--heartbeat_timeout_ms", str(HEARTBEAT_TIMEOUT_MS)], workload, detect=None)
        env = {**child_env(), "TORCHFT_LIGHTHOUSE": f"http://127.0.0.1:{port}"}
        t_start = time.time()
        replicas = [start_logged(f"replica{r}", [
            tool("torchrun") or "torchrun", "--standalone", "--nnodes", "1",
            "--nproc-per-node", "1", "--max-restarts", str(len(workload.fault_plan) + 1),
            "--monitor-interval", "0.1", "-m", "peers.torchft_worker",
            os.path.join(workload.run_dir, "workload.json"), "--replica", str(r)],
            workload, detect=QuorumChange(), env=env) for r in range(workload.world_size)]
        try:
            codes, error = wait_all(replicas, self.timeout_s, first_success_ends=True)
        finally:
            stop([lighthouse])
        if error is not None or 0 not in codes:
            run.status = "failed"
            run.error = error or f"replica launchers exited with {codes}; see replica*.log"
        return collect(run, workload, t_start)
