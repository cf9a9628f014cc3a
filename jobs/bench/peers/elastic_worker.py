"""One rank of the benchmark workload, started by torchrun or NVRx's ft_launcher.

    torchrun --standalone --nproc-per-node 2 --max-restarts 5 \
        -m peers.elastic_worker RUN/workload.json
    ft_launcher --standalone --nproc-per-node 2 --max-restarts 5 --ft-rank-heartbeat-timeout 5 \
        -m peers.elastic_worker RUN/workload.json --nvrx-heartbeats

(with `jobs/bench` on PYTHONPATH). The launcher sets RANK / WORLD_SIZE / MASTER_ADDR /
MASTER_PORT and restarts every rank when one fails; this script resumes from the newest
checkpoint: DCP async durable ones, or NVRx's node-local ones when newer (`harness.tiers`).
Its process-group timeout is the workload's detection timeout: a rank blocked in a collective
on a hung peer fails after it, which is how torchrun notices a hang. With `--nvrx-heartbeats` it
reports to ft_launcher's rank monitor through `RankMonitorClient`: one heartbeat when training
starts and one per completed step, so a rank that stops stepping is killed and the group
restarted once the heartbeat times out.
"""

from __future__ import annotations

import time

_T_PROCESS = time.time()  # first statement: the rank's process start, before the torch import

# The imports come after that timestamp on purpose (torch takes seconds to import).
import argparse
import os
from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist
from harness.events import EventLog
from harness.spec import Workload
from harness.tiers import TieredCheckpoints
from harness.workload import train


def _heartbeats() -> tuple[Callable[[int], None], Callable[[], None]]:
    """Connect to ft_launcher's rank monitor; returns (per-step hook, shutdown)."""
    # Imported here: torchrun's workers do not need NVRx (its import would count in their start).
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient  # noqa: PLC0415

    client = RankMonitorClient()
    client.init_workload_monitoring()
    client.send_heartbeat()  # the first heartbeat ends the "initial" timeout (startup, load)
    return (lambda _step: client.send_heartbeat()), client.shutdown_workload_monitoring


def _init_process_group(rank: int, world_size: int, timeout_s: float) -> None:
    """gloo process group from the launcher's environment, namespaced by restart.

    torchrun (torch 2.13, c10d rendezvous) keeps one TCPStore for all restarts and its workers
    connect to it without a per-attempt prefix, so a restarted rank can read its peer's gloo
    address from the previous attempt and fail ("connectFullMesh ... Connection refused") or
    hang. Prefixing the keys with the restart count, as torch's own comment there assumes
    happens, makes every attempt rendezvous on fresh keys. ft_launcher's workers host their
    own store per attempt and take the plain path.
    """
    timeout = timedelta(seconds=timeout_s)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group("gloo", timeout=timeout)
        return
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False, timeout=timeout)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt_{attempt}", store),
                            rank=rank, world_size=world_size, timeout=timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("workload", help="path of the run's workload.json")
    parser.add_argument("--nvrx-heartbeats", action="store_true",
                        help="send NVRx RankMonitorClient heartbeats (under ft_launcher)")
    args = parser.parse_args(argv)
    workload = Workload.read(args.workload)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    log = EventLog(workload.run_dir, f"rank{rank}-pid{os.getpid()}")
    log.start(rank, _T_PROCESS)
    log.write("imported", rank=rank)  # the start-up split: imports, then rendezvous
    _init_process_group(rank, world_size, workload.detect_timeout_s)
    on_step, shutdown = _heartbeats() if args.nvrx_heartbeats else (None, None)
    ckpt = TieredCheckpoints(workload, rank, log, local=workload.local_interval > 0)
    train(workload, rank=rank, world_size=world_size, log=log, ckpt=ckpt, on_step=on_step)
    if shutdown is not None:
        shutdown()
    # No destroy_process_group(): with FSDP2 + gloo it intermittently aborts the process at
    # exit (SIGABRT, "terminate called without an active exception", torch 2.13), which the
    # launcher would count as a failure. The process exits right after; the OS closes sockets.
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
