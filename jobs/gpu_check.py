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
  at_size              the same at a real rank's size (~2 GB of fp32 parameters + AdamW state on
                       the GPU: the benchmarks' "1gb" model whole on one rank, built on the meta
                       device and filled in place): the defaults' fault-free step against
                       `ResilienceConfig.disabled()` (interleaved runs, mean step), then an
                       exception and a SIGKILL, each ending bit-equal to the clean run, and no
                       save skipped for lack of a snapshot slot
Without CUDA (or with --dry-run) the parts that can run on the CPU do; exit status 1 if any
part failed.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import ray_resilience as rr
from ray_resilience.examples.llama import (
    build_model,
    build_sharded,
    causal_lm_loss,
    load_or_init,
)
from ray_resilience.examples.token_data import TokenDataset, generate_shards

STEPS, FAULT_STEP = 10, 6
SIZE_STEPS, SIZE_FAULT_STEP, SIZE_INTERVAL = 40, 25, 10
"""The at-size runs: steps, the step the faults fire at, committed checkpoint interval."""
SIZE_BATCH, SIZE_SEQ = 8, 512


class PartFailed(AssertionError):
    """A check failed after measuring: the report keeps what was measured."""

    def __init__(self, message: str, measured: dict[str, Any]) -> None:
        super().__init__(message)
        self.measured = measured


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


def _size_model() -> Any:
    from ray_resilience.examples.llama import LlamaConfig  # noqa: PLC0415 - this part only

    # The benchmarks' "1gb" shape (jobs/bench/harness/sizes.py), without dropout: ~167M
    # parameters, 2.0 GB of fp32 parameters and AdamW moments on one rank.
    return LlamaConfig(dim=1024, n_layers=9, n_heads=16, n_kv_heads=4, vocab_size=32000,
                       ffn_dim=2816, max_seq_len=SIZE_SEQ)


def _train_at_size(cfg: dict[str, Any]) -> dict[str, Any]:
    # Bit-equal runs on a GPU need deterministic kernels: the first H200 sitting differed by
    # ~1e-4 between two clean runs, from the memory-efficient attention's backward (it warns);
    # the math attention is deterministic.
    from torch.backends import cuda as cuda_backends  # noqa: PLC0415 - not shipped by value

    torch.use_deterministic_algorithms(True, warn_only=True)
    cuda_backends.enable_flash_sdp(False)
    cuda_backends.enable_mem_efficient_sdp(False)
    cuda_backends.enable_cudnn_sdp(False)
    ctx = rr.get_context()
    device = str(ctx.device)
    model_cfg = _size_model()
    # As the README says to build large models: sharded on the meta device and filled from the
    # checkpoint (or initialized) in place, so a restart does not initialize the whole model.
    model = build_sharded(model_cfg, device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loaded = load_or_init(model, optimizer)
    ends = []
    for step in range((loaded.step if loaded else 0) + 1, cfg["steps"] + 1):
        tokens = torch.randint(0, model_cfg.vocab_size, (SIZE_BATCH, SIZE_SEQ + 1),
                               generator=torch.Generator().manual_seed(step)).to(device)
        loss = causal_lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        rr.report({"loss": loss.item()}, step=step, checkpoint=rr.CheckpointState(model, optimizer))
        ends.append((step, time.perf_counter()))
    state = {k: getattr(v, "full_tensor", lambda v=v: v)().detach().cpu()
             for k, v in model.state_dict().items()}
    return {"state": state, "ends": ends, "tier": loaded.tier if loaded else None,
            "pid": os.getpid()}


def _step_gaps(ends: list[tuple[int, float]], skip: int) -> list[float]:
    """Seconds between consecutive reports after the first `skip` steps (a periodic cost, such
    as a save every N steps, shows in their mean and not in their median)."""
    return [b[1] - a[1] for a, b in zip(ends, ends[1:], strict=False)
            if b[0] == a[0] + 1 and a[0] > skip]


def _max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def at_size(device: str) -> dict[str, Any]:
    import ray  # noqa: PLC0415 - this part only

    from ray_resilience.errors import TrainingFailedError  # noqa: PLC0415
    from ray_resilience.testing import Fault, FaultPlan  # noqa: PLC0415

    gpu = device == "cuda"
    arms = [("disabled", None, None), ("default", SIZE_INTERVAL, None),
            ("exception", SIZE_INTERVAL, "exception"), ("sigkill", SIZE_INTERVAL, "sigkill"),
            ("disabled_2", None, None), ("default_2", SIZE_INTERVAL, None)]
    out: dict[str, Any] = {"state_bytes": None, "runs": {}}
    states: dict[str, dict[str, torch.Tensor]] = {}
    with tempfile.TemporaryDirectory(prefix="rr-gpu-check-") as work:
        ray.init(num_cpus=8, num_gpus=1 if gpu else 0, include_dashboard=False,
                 _temp_dir=os.path.join(work, "ray"), configure_logging=False)
        try:
            for name, interval, kind in arms:
                plan = None if kind is None else FaultPlan.explicit(
                    [Fault(step=SIZE_FAULT_STEP, rank=0, kind=kind)])
                resilience = (rr.ResilienceConfig.disabled() if interval is None else
                              rr.ResilienceConfig.default(checkpoint_interval=interval,
                                                          fault_plan=plan))
                t0 = time.perf_counter()
                run: dict[str, Any] = {"ok": False}
                out["runs"][name] = run
                try:
                    result = rr.ResilientTrainer(
                        _train_at_size, train_loop_config={"steps": SIZE_STEPS},
                        scaling_config=rr.ScalingConfig(num_workers=1, use_gpu=gpu),
                        run_config=rr.RunConfig(name=f"gpu-size-{name}", verbose=False,
                                                storage_path=os.path.join(work, "runs")),
                        resilience=resilience).fit()
                except TrainingFailedError as exc:
                    run.update(error=str(exc)[:2000], wall_s=time.perf_counter() - t0)
                    print(f"  at_size {name}: FAILED {str(exc)[:300]}", flush=True)
                    continue
                run.update(ok=True, wall_s=time.perf_counter() - t0)
                value = result.return_values[0]
                states[name] = value["state"]
                gaps = _step_gaps(value["ends"], skip=5)
                ckpt = result.checkpoint or {}
                run.update(mean_step_s=sum(gaps) / len(gaps),
                           median_step_s=statistics.median(gaps), step_gaps_s=gaps,
                           attempts=result.attempts, tier=value["tier"],
                           local_interval_steps=result.local_interval_steps,
                           committed_steps=ckpt.get("stats", {}).get("committed_steps"),
                           dropped=[(d["step"], d["kind"]) for d in ckpt.get("dropped", [])],
                           checkpoint=json.loads(json.dumps(ckpt, default=str)))
                if result.goodput is not None and result.goodput.faults:
                    fault = result.goodput.faults[0]
                    run.update(recovery_s=fault.recovery_s, steps_redone=fault.steps_redone,
                               checkpoint_tier=fault.checkpoint_tier,
                               checkpoint_load_s=fault.checkpoint_load_s)
                if "default" in states and name != "default":
                    run["max_abs_diff_vs_default"] = _max_abs_diff(value["state"],
                                                                   states["default"])
                del value
                print(f"  at_size {name}: " + ", ".join(
                    f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in run.items() if k not in ("checkpoint", "step_gaps_s")),
                    flush=True)
        finally:
            ray.shutdown()
    if "default" in states:
        out["state_bytes"] = 3 * sum(t.numel() * t.element_size()
                                     for t in states["default"].values())
    steps = {n: r.get("mean_step_s") for n, r in out["runs"].items()}
    if all(steps.get(n) for n in ("disabled", "default", "disabled_2", "default_2")):
        out["default_cost"] = ((steps["default"] + steps["default_2"])
                               / (steps["disabled"] + steps["disabled_2"]) - 1)
    problems = [f"{n}: {r['error']}" for n, r in out["runs"].items() if not r["ok"]]
    problems += [f"{n}: saves skipped for lack of a snapshot slot: {r['dropped']}"
                 for n, r in out["runs"].items()
                 if any(kind == "skipped" for _, kind in r.get("dropped", []))]
    problems += [f"{n} differs from the clean run by {r['max_abs_diff_vs_default']:.3g}"
                 for n, r in out["runs"].items()
                 if n in ("exception", "sigkill", "default_2") and r.get("max_abs_diff_vs_default")]
    if problems:
        raise PartFailed("; ".join(problems), out)
    return out


PARTS: list[tuple[str, Callable[[str], dict[str, Any]], bool]] = [
    ("fsdp2_nccl", fsdp2_nccl, True), ("d2h_bandwidth", d2h_bandwidth, True),
    ("overlapped_snapshot", overlapped_snapshot, False), ("cuda_health", cuda_health, True),
    ("inprocess_restart", inprocess_restart, False), ("at_size", at_size, True)]
"""(name, check, needs CUDA); the others run on the CPU without one."""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="no CUDA even if there is a GPU")
    p.add_argument("--out", default="gpu_check.json", help="where the JSON report goes")
    p.add_argument("--parts", default=",".join(name for name, _, _ in PARTS))
    p.add_argument("--code", default=None,
                   help="the commit the checkout is at, for the report (a GPU machine's copy of "
                        "the tree may have no .git)")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.dry_run
    # cuBLAS's deterministic workspace, for the bit-equal checks (inherited by Ray's workers).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    device = "cuda" if cuda else "cpu"
    import platform  # noqa: PLC0415 - the report's header only

    import ray  # noqa: PLC0415 - the report's header only

    report: dict[str, Any] = {
        "cuda": cuda, "dry_run": args.dry_run, "torch": torch.__version__, "ray": ray.__version__,
        "python": platform.python_version(), "cpus": os.cpu_count(), "code": args.code,
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
            entry = {"status": "failed", **getattr(exc, "measured", {}),
                     "error": f"{type(exc).__name__}: {exc}",
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
                     for k, v in entry.items()
                     if k not in ("status", "seconds", "losses", "runs", "traceback"))


if __name__ == "__main__":
    sys.exit(main())
