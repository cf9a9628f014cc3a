"""torchft 0.2.0: per-step quorum through a lighthouse; survivors keep training, the failed
replica is restarted by its own launcher and heals from a live peer.

Deployment as torchft documents it, scaled to this machine: one `torchft_lighthouse`, and one
`torchrun --max-restarts` per replica group (here one rank each), all started by this runner.
The manager runs torchft's default asynchronous quorum; its timeout is the workload's detection
timeout. Detection is the lighthouse's heartbeat timeout or, sooner, the survivor's failed
allreduce; the survivor goes on alone, so "recovery" (fault to the next completed step) measures
how long training stalled, while the full world is back only when the restarted replica healed.
Hangs are not supported: a hung replica's manager keeps heartbeating from its own thread, so the
lighthouse waits `join_timeout_ms` for it at every quorum, and nothing kills it.

`torchft-ckpt` adds periodic durable DCP checkpoints from replica 0 (`torchft_loop`).
Not comparable bit for bit with a fault-free run: while a replica is down the survivor trains on
its share of the batch only (torchft's design).
"""

from __future__ import annotations

import os
import re
import socket
import time

from harness.launcher import (
    NODE_LOSS_UNSUPPORTED,
    child_env,
    collect,
    start_logged,
    stop,
    tool,
    wait_all,
)
from harness.spec import PeerRun, Workload

from ray_resilience.testing import FaultKind

#: The lighthouse drops a replica whose manager has not heartbeated for this long (torchft's
#: default is 5000 ms; lower lets it drop a dead replica sooner).
HEARTBEAT_TIMEOUT_MS = 2000
#: How long a quorum waits for heartbeating stragglers: long enough for both replicas to be in
#: the first quorum (torch import and model build take seconds).
JOIN_TIMEOUT_MS = 30000
QUORUM_TICK_MS = 100
LIGHTHOUSE_KWARGS = {"min_replicas": 1, "join_timeout_ms": JOIN_TIMEOUT_MS,
                     "quorum_tick_ms": QUORUM_TICK_MS, "heartbeat_timeout_ms": HEARTBEAT_TIMEOUT_MS}
NOTE_NOT_BIT_EQUAL = ("survivors train on their share of the batch while a replica is down, so "
                      "final parameters are not expected to be bit-equal")
_QUORUM_ID = re.compile(r"quorum_id: (\d+)")
HANG_UNSUPPORTED = ("a hung replica's manager keeps heartbeating, so the lighthouse waits "
                    "join_timeout_ms for it at every quorum and nothing kills it")


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

    supported_kinds = frozenset({FaultKind.EXCEPTION, FaultKind.SIGKILL, FaultKind.OOM})
    unsupported_reasons = {FaultKind.HANG: HANG_UNSUPPORTED,
                           FaultKind.NODE_LOSS: NODE_LOSS_UNSUPPORTED}
    num_spares = 0
    local_tier = False

    def __init__(self, *, durable: bool, timeout_s: float = 900.0) -> None:
        self.durable, self.timeout_s = durable, timeout_s
        self.name = "torchft-ckpt" if durable else "torchft"
        self.uses_durable = durable
        self.config = (f"default async quorum; manager timeout = detection timeout; lighthouse "
                       f"heartbeat {HEARTBEAT_TIMEOUT_MS} ms, join {JOIN_TIMEOUT_MS} ms; "
                       "replicated model, heal from a live peer"
                       + ("; replica 0 saves DCP async (thread checkpointer)" if durable
                          else "; no durable checkpoints"))

    def available(self) -> str | None:
        if tool("torchft_lighthouse") is None or tool("torchrun") is None:
            return "torchft_lighthouse or torchrun is missing from this environment"
        return None

    def run(self, workload: Workload) -> PeerRun:
        workload.write()
        run = PeerRun(mechanism=self.name, run_dir=workload.run_dir, notes=[NOTE_NOT_BIT_EQUAL])
        port = _free_port()
        t_start = time.time()
        lighthouse = start_logged("lighthouse", [
            tool("torchft_lighthouse") or "torchft_lighthouse", "--bind", f"127.0.0.1:{port}",
            *[f"--{k}={v}" for k, v in LIGHTHOUSE_KWARGS.items()]], workload, detect=None)
        env = {**child_env(), "TORCHFT_LIGHTHOUSE": f"http://127.0.0.1:{port}"}
        replicas = [start_logged(f"replica{r}", [
            tool("torchrun") or "torchrun", "--standalone", "--nnodes", "1",
            "--nproc-per-node", "1", "--max-restarts", str(len(workload.fault_plan) + 1),
            "--monitor-interval", "0.1", "-m", "peers.torchft_worker",
            os.path.join(workload.run_dir, "workload.json"), "--replica", str(r),
            *(["--durable"] if self.durable else [])],
            workload, detect=QuorumChange(), env=env) for r in range(workload.world_size)]
        try:
            codes, error = wait_all(replicas, self.timeout_s, first_success_ends=True)
        finally:
            stop([lighthouse])
        if error is not None or 0 not in codes:
            run.status = "failed"
            run.error = error or f"replica launchers exited with {codes}; see replica*.log"
        return collect(run, workload, t_start)
