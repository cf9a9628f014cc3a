"""GPU readiness: the CUDA paths of ray_resilience in one run of a few minutes on one GPU.

    python jobs/gpu_check.py --out gpu_check.json             # on a machine with a GPU
    python jobs/gpu_check.py --dry-run --out /tmp/check.json  # anywhere: CUDA parts SKIP

Parts, each PASS, FAIL or SKIP (needs CUDA) with its measurements in the JSON report:
  fsdp2_nccl           FSDP2 on a 1-rank NCCL group: a few training steps, finite losses
  d2h_bandwidth        device-to-host copy of 1 GiB into pinned and into pageable memory
  overlapped_snapshot  a local-tier snapshot copied on a side stream while the next step runs,
                       the optimizer step queued behind the copy's event, restored bit-equal
  cuda_health          the rank's CUDA health check (`_internal/rank/health.py`)
  inprocess_restart    `ResilientTrainer` with 1 GPU worker: an exception at step 6 restarts in
                       the same process from the local tier and ends bit-equal to a clean run
Without CUDA (or with --dry-run) the parts that can run on the CPU do; exit status 1 if any
part failed.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ray_resilience as rr
from ray_resilience.examples.llama import build_model, causal_lm_loss
from ray_resilience.examples.token_data import TokenDataset, generate_shards

STEPS, FAULT_STEP = 10, 6


def _preset(device: str) -> str:
    """~30M parameters on a GPU; the tiny model where the check runs on CPU cores."""
    return "small" if device == "cuda" else "tiny"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: str,
          seed: int) -> float:
    tokens = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(seed))
    tokens = tokens.to(device)
    loss = causal_lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def fsdp2_nccl(device: str) -> dict[str, Any]:
    import torch.distributed as dist  # noqa: PLC0415 - this part only
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415 - this part only

    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_port()}", rank=0,
                            world_size=1)
    try:
        model = build_model(_preset(device), device=device)
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses, t0 = [], time.perf_counter()
        for seed in range(5):
            losses.append(_step(model, optimizer, device, seed))
        torch.cuda.synchronize()
        assert all(x == x and abs(x) < 1e4 for x in losses), losses
        return {"losses": losses, "step_s": (time.perf_counter() - t0) / 5}
    finally:
        dist.destroy_process_group()


def d2h_bandwidth(device: str) -> dict[str, Any]:
    source = torch.empty(2**30, dtype=torch.uint8, device=device).random_()
    out = {}
    for name, target in (("pinned", torch.empty(2**30, dtype=torch.uint8, pin_memory=True)),
                         ("pageable", torch.empty(2**30, dtype=torch.uint8))):
        target.copy_(source, non_blocking=True)  # warm-up
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(3):
            target.copy_(source, non_blocking=True)
        end.record()
        end.synchronize()
        out[f"{name}_gb_s"] = 3 * 2**30 / (start.elapsed_time(end) / 1000) / 1e9
        assert torch.equal(target[:4096].to(device), source[:4096])
    return out


def overlapped_snapshot(device: str) -> dict[str, Any]:
    """The pipeline's local-tier path on `device`, as a rank runs it."""
    from ray_resilience._internal.checkpoint.format.extra_codec import (  # noqa: PLC0415
        snapshot_extra,
    )
    from ray_resilience._internal.checkpoint.format.local_roots import (  # noqa: PLC0415
        node_root,
        run_root,
    )
    from ray_resilience._internal.checkpoint.rank import loader  # noqa: PLC0415
    from ray_resilience._internal.checkpoint.rank.handoff import (  # noqa: PLC0415
        HandoffPipeline,
    )
    from ray_resilience._internal.checkpoint.rank.local.schedule import (  # noqa: PLC0415
        LocalSchedule,
    )
    from ray_resilience._internal.checkpoint.rank.local.tier import (  # noqa: PLC0415
        LocalSnapshots,
        layout_digest,
    )
    from ray_resilience._internal.checkpoint.rank.slots import (  # noqa: PLC0415
        LocalWrite,
        RankSaveStats,
    )
    from ray_resilience._internal.checkpoint.rank.state_cache import StateCache  # noqa: PLC0415
    from ray_resilience._internal.checkpoint.rank.writer_link import (  # noqa: PLC0415
        WriterLink,
    )

    config = rr.CheckpointConfig(snapshot="overlap")
    model = build_model(_preset(device), device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _step(model, optimizer, device, 0)
    expected = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    with tempfile.TemporaryDirectory(prefix="rr-gpu-check-", dir="/dev/shm") as local_dir:
        # The layout cleanup accepts: a private parent, a run folder named by run and node.
        root = node_root(run_root(local_dir, "gpu-check", "0" * 12), "0" * 16)
        store = LocalSnapshots(root, 0)
        pipeline = HandoffPipeline(
            rank=0, world_size=1, config=config, stats=RankSaveStats(), local=store,
            link=WriterLink(rank=0, writer=None, writer_id="", coordinator=None),
            schedule=LocalSchedule(config, rank=0))
        try:
            pipeline.begin_session("0" * 16)
            source = StateCache().source(model, optimizer, lambda n: True)
            pipeline.copier.guard(optimizer)
            t0 = time.perf_counter()
            pipeline.stage(1, source, snapshot_extra({"step": 1}), copy_all_now=False,
                           save=False, local=LocalWrite("0" * 16, 1, layout_digest(source.items)))
            stage_s = time.perf_counter() - t0
            gpu_copy = any(s.event is not None for s in pipeline.pool.slots)
            _step(model, optimizer, device, 1)  # its optimizer step waits on the copy's event
            guard_s = pipeline.copier.take_guard_wait_s()
            assert pipeline.wait_local_idle(120), "the local write did not finish"
        finally:
            pipeline.close()
        fresh = build_model(_preset(device), seed=1, device=device)
        fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
        target = loader.LoadTarget(rank=0, storage=None, coordinator=None, memory_tier=False,
                                   model=fresh, optimizer=fresh_opt,
                                   local=LocalSnapshots(root, 0))
        offer, own = loader._local_offer(target)
        state, loaded, error = loader._try_local(target, offer[0], own)
        assert error is None, error
        loader._apply(fresh, fresh_opt, state)
    got = {k: v.detach().cpu() for k, v in fresh.state_dict().items()}
    differ = [k for k in expected if not torch.equal(expected[k], got[k])]
    assert not differ, f"restored parameters differ: {differ[:5]}"
    return {"stage_s": stage_s, "guard_wait_cpu_s": guard_s, "copied_on_a_cuda_stream": gpu_copy,
            "state_bytes": source.tensor_bytes}


def cuda_health(device: str) -> dict[str, Any]:
    from ray_resilience._internal.rank.health import cuda_health as check  # noqa: PLC0415

    problem = check(0)
    assert problem is None, problem
    return {"device": torch.cuda.get_device_name(0)}


def _train(cfg: dict[str, Any]) -> dict[str, Any]:
    ctx = rr.get_context()
    device = str(ctx.device)
    model = build_model(_preset(ctx.device.type), device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loaded = rr.load_checkpoint(model=model, optimizer=optimizer)
    data = TokenDataset(cfg["data_dir"])
    for step in range((loaded.step if loaded else 0) + 1, STEPS + 1):
        inputs, targets = data.batch(step - 1, 0, 1, 2)
        loss = causal_lm_loss(model(inputs.to(device)), targets.to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        rr.report({"loss": loss.item()}, step=step, checkpoint=rr.CheckpointState(model, optimizer))
    return {"state": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "tier": loaded.tier if loaded else None, "pid": os.getpid()}


def inprocess_restart(device: str) -> dict[str, Any]:
    import ray  # noqa: PLC0415 - this part only

    from ray_resilience.testing import Fault, FaultPlan  # noqa: PLC0415

    gpu = device == "cuda"
    with tempfile.TemporaryDirectory(prefix="rr-gpu-check-") as work:
        generate_shards(os.path.join(work, "data"))
        ray.init(num_cpus=4, num_gpus=1 if gpu else 0, include_dashboard=False,
                 _temp_dir=os.path.join(work, "ray"), configure_logging=False)
        try:
            runs = {}
            for name, plan in (("clean", None), ("fault", FaultPlan.explicit(
                    [Fault(step=FAULT_STEP, rank=0, kind="exception")]))):
                runs[name] = rr.ResilientTrainer(
                    _train, train_loop_config={"data_dir": os.path.join(work, "data")},
                    scaling_config=rr.ScalingConfig(num_workers=1, use_gpu=gpu),
                    run_config=rr.RunConfig(name=f"gpu-check-{name}", verbose=False,
                                            storage_path=os.path.join(work, "runs")),
                    resilience=rr.ResilienceConfig.default(fault_plan=plan)).fit()
        finally:
            ray.shutdown()
    clean, fault = runs["clean"], runs["fault"]
    assert clean.ok and fault.ok, (clean.error, fault.error)
    value = fault.return_values[0]
    bit_equal = all(torch.equal(v, clean.return_values[0]["state"][k])
                    for k, v in value["state"].items())
    assert fault.attempts == 2 and value["pid"] == fault.worker_pids[0], fault.summary()
    assert bit_equal, "the recovered run's parameters differ from the clean run's"
    recovery = fault.goodput.faults[0]
    return {"tier": value["tier"], "local_interval_steps": fault.local_interval_steps,
            "recovery_s": recovery.recovery_s, "steps_redone": recovery.steps_redone,
            "bit_equal": bit_equal}


PARTS: list[tuple[str, Callable[[str], dict[str, Any]], bool]] = [
    ("fsdp2_nccl", fsdp2_nccl, True), ("d2h_bandwidth", d2h_bandwidth, True),
    ("overlapped_snapshot", overlapped_snapshot, False), ("cuda_health", cuda_health, True),
    ("inprocess_restart", inprocess_restart, False)]
"""(name, check, needs CUDA); the others run on the CPU without one."""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="no CUDA even if there is a GPU")
    p.add_argument("--out", default="gpu_check.json", help="where the JSON report goes")
    p.add_argument("--parts", default=",".join(name for name, _, _ in PARTS))
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.dry_run
    device = "cuda" if cuda else "cpu"
    report: dict[str, Any] = {
        "cuda": cuda, "dry_run": args.dry_run, "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu", "parts": {}}
    wanted = set(args.parts.split(","))
    for name, check, needs_cuda in PARTS:
        if name not in wanted:
            continue
        if needs_cuda and not cuda:
            why = "--dry-run" if args.dry_run else "no CUDA device in this process"
            print(f"SKIP {name}: needs CUDA ({why})", flush=True)
            report["parts"][name] = {"status": "skipped", "why": why}
            continue
        t0 = time.perf_counter()
        try:
            entry = {"status": "passed", **check(device)}
        except Exception as exc:  # noqa: BLE001 - every part is reported, the rest still run
            entry = {"status": "failed", "error": f"{type(exc).__name__}: {exc}",
                     "traceback": traceback.format_exc()}
        entry["seconds"] = time.perf_counter() - t0
        report["parts"][name] = entry
        print(f"{'PASS' if entry['status'] == 'passed' else 'FAIL'} {name} on {device} "
              f"({entry['seconds']:.1f} s): {entry.get('error') or _brief(entry)}", flush=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, sort_keys=True, default=str)
    print(f"wrote {args.out}")
    return 1 if any(e["status"] == "failed" for e in report["parts"].values()) else 0


def _brief(entry: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in entry.items() if k not in ("status", "seconds", "losses"))


if __name__ == "__main__":
    sys.exit(main())
