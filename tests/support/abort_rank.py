"""One rank of the collective-abort scenarios in tests/process/test_abort.py (real gloo, real
processes).

Run as ``python -m tests.support.abort_rank SCENARIO RANK CONTROL_PORT [ARG]``; the last stdout
line is ``RESULT <json>``. tests/support/abort_harness.py holds the stand-in supervisor and the
fault protocol.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist

from ray_resilience._internal.process_groups.abort import CollectiveAborter
from ray_resilience._internal.process_groups.teardown import freeze_startup_objects, resource_counts
from tests.support.abort_harness import (
    PG_TIMEOUT_S,
    WORLD_SIZE,
    Control,
    FsdpRun,
    blocked_call,
    end_attempt,
    fault_protocol,
    init_attempt,
    thread_names,
)


def scenario_allreduce(ctl: Control, group_kind: str) -> dict[str, Any]:
    """(a)+(b): a blocked all_reduce is aborted; then a new group on a new port works."""
    aborter = CollectiveAborter()
    out: dict[str, Any] = {"gloo_at_init": init_attempt(aborter, ctl)}
    group = dist.new_group([0, 1]) if group_kind == "late_subgroup" else None
    warm = torch.ones(1)
    dist.all_reduce(warm, group=group)
    out["warmup_value"] = warm.item()
    out.update(fault_protocol(aborter, ctl,
                              functools.partial(dist.all_reduce, torch.ones(1), group=group)))
    del group
    out["teardown"] = end_attempt(aborter)
    init_attempt(aborter, ctl)
    value = torch.tensor([float(ctl.rank + 1)])
    dist.all_reduce(value)
    out["reinit_value"] = value.item()
    out["teardown2"] = end_attempt(aborter)
    return out


def scenario_fsdp(ctl: Control, phase: str) -> dict[str, Any]:
    """(c): rank 0 blocked in FSDP2's forward or backward collectives, then a clean rebuild."""
    aborter = CollectiveAborter()
    init_attempt(aborter, ctl)
    run = FsdpRun()
    out: dict[str, Any] = {"losses": [run.step(), run.step()]}
    reached: list[str] = []
    if ctl.rank == 1 and phase == "backward":
        run.forward()  # joins the forward all-gathers, then never the backward ones
    out.update(fault_protocol(aborter, ctl, functools.partial(run.forward_backward, reached)))
    out["reached"] = reached
    del run
    out["teardown"] = end_attempt(aborter)
    init_attempt(aborter, ctl)
    out["losses_after"] = [FsdpRun().step()]
    out["teardown2"] = end_attempt(aborter)
    return out


def scenario_soak(ctl: Control, cycles: str) -> dict[str, Any]:
    """(f): per attempt: FSDP2 step, abort mid-step, teardown; resources after each."""
    freeze_startup_objects()
    aborter = CollectiveAborter()
    start, start_threads = dataclasses.asdict(resource_counts()), thread_names()
    counts, errors, meshes, latencies = [], [], [], []
    for _ in range(int(cycles)):
        init_attempt(aborter, ctl)
        run = FsdpRun()
        run.step()
        out = fault_protocol(aborter, ctl, run.step, delay_s=0.2)
        errors.append(out.get("error", ""))
        latencies.append(out.get("raise_after_abort_ms"))
        del run
        end_attempt(aborter, count_meshes=False)
        counts.append(dataclasses.asdict(resource_counts()))
        meshes.append(counts[-1]["device_meshes"])
    return {"start": start, "counts": counts, "errors": errors, "meshes_after_teardown": meshes,
            "raise_after_abort_ms": latencies,
            "threads_at_start": sorted(start_threads), "threads": sorted(thread_names()),
            "intra_op_threads": torch.get_num_threads()}


def scenario_rendezvous(ctl: Control, _: str) -> dict[str, Any]:
    """Rank 0 waits in ``init_process_group`` for a rank 1 that never comes; abort with the
    store."""
    if ctl.rank == 1:
        ctl.attempt += 1
        ctl.wait_aborted()
        return {}
    aborter = CollectiveAborter()
    port = ctl.next_rendezvous_port()
    aborter.snapshot_before_init(store_port=port)
    out = blocked_call(aborter, lambda: dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=WORLD_SIZE,
        timeout=datetime.timedelta(seconds=PG_TIMEOUT_S)), include_store=True)
    ctl.signal_aborted()
    out["teardown"] = end_attempt(aborter)
    return out


SCENARIOS = {"allreduce": scenario_allreduce, "fsdp": scenario_fsdp, "soak": scenario_soak,
             "rendezvous": scenario_rendezvous}


def main(argv: list[str]) -> None:
    scenario, rank, control_port = argv[0], int(argv[1]), int(argv[2])
    ctl = Control(rank, control_port)
    result = SCENARIOS[scenario](ctl, argv[3] if len(argv) > 3 else "")
    result.update(rank=rank, pid=os.getpid(), torch=torch.__version__,
                  control_store_ok=ctl.finish())
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
