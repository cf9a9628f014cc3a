"""One torchft replica group (one rank) of the benchmark workload, started by torchrun.

    TORCHFT_LIGHTHOUSE=http://localhost:29510 torchrun --standalone --nproc-per-node 1 \
        --max-restarts 5 -m peers.torchft_worker RUN/workload.json --replica 1 [--durable]

The loop is `torchft_loop.run_replica`.
"""

from __future__ import annotations

import time

_T_PROCESS = time.time()  # first statement: the replica's process start, before the torch import

# The imports come after that timestamp on purpose (torch takes seconds to import).
import argparse
import os

from harness.events import EventLog
from harness.spec import Workload

from .torchft_loop import run_replica


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("workload", help="path of the run's workload.json")
    parser.add_argument("--replica", type=int, required=True, help="replica group index")
    parser.add_argument("--durable", action="store_true", help="replica 0 saves DCP checkpoints")
    args = parser.parse_args(argv)
    workload = Workload.read(args.workload)
    log = EventLog(workload.run_dir, f"rank{args.replica}-pid{os.getpid()}")
    log.start(args.replica, _T_PROCESS)
    run_replica(workload, args.replica, log, durable=args.durable)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
