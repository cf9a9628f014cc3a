"""What an in-process rebuild costs the steps after it, by glibc allocator setting.

An in-process restart frees the attempt's model and optimizer and builds them again in the same
process (docs/design.md, sections 5 and 8). This probe does that without Ray or this library: 2
gloo processes train the benchmark's FSDP2 LLaMA of one size (`harness/sizes.py`, AdamW, one
intra-op thread, on a thread of their own as ours' ranks do), then free the model and optimizer,
build them again on the meta device, copy the saved state in, and train on; twice. Each step's
wall time, and the training thread's minor page faults and system CPU time, are recorded on rank
0. The variants run alternately, each in fresh processes:

- `default`: glibc as it comes (big blocks mmap'd and unmapped at every free);
- `trim`: the same plus `malloc_trim(0)` after the free, as ours' teardown does;
- `keep`: glibc told to keep freed memory for reuse (`KEEP_ENV`: one arena, no mmap'd blocks,
  no trimming), so the rebuilt state and every step's tensors reuse pages already touched.

    python jobs/bench/overhead/rebuild_probe.py --size 200mb --reps 2 --out results.json
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time

KEEP_ENV = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0",
            "MALLOC_TRIM_THRESHOLD_": str(1 << 40), "MALLOC_TOP_PAD_": "0"}
VARIANTS = {"default": ({}, False), "trim": ({}, True), "keep": (KEEP_ENV, False)}
HERE = os.path.dirname(os.path.abspath(__file__))


def _thread_usage() -> tuple[int, float]:
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_minflt, usage.ru_stime


def _train(size_name: str, steps: int, rebuilds: int, trim: bool, rows: list) -> None:
    import torch  # noqa: PLC0415 - the parent process never imports torch
    from harness.sizes import size  # noqa: PLC0415

    from ray_resilience.examples.llama import build_sharded, causal_lm_loss  # noqa: PLC0415

    torch.set_num_threads(1)
    sz = size(size_name)
    cfg = sz.model
    data = torch.Generator().manual_seed(torch.distributed.get_rank())

    def build() -> tuple:
        model = build_sharded(cfg)
        model.to_empty(device="cpu")
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)

    def run(model: torch.nn.Module, optimizer: torch.optim.Optimizer, phase: str) -> None:
        for i in range(steps):
            faults, system = _thread_usage()
            start = time.perf_counter()
            x = torch.randint(0, cfg.vocab_size, (sz.batch_size, sz.seq_len), generator=data)
            y = torch.randint(0, cfg.vocab_size, (sz.batch_size, sz.seq_len), generator=data)
            causal_lm_loss(model(x), y).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            wall = time.perf_counter() - start
            faults_after, system_after = _thread_usage()
            rows.append({"phase": phase, "step": i, "wall_s": wall,
                         "minor_faults": faults_after - faults, "system_s": system_after - system})

    model, optimizer = build()
    with torch.no_grad():
        for p in model.parameters():
            p.to_local().normal_(0, 0.02)
    run(model, optimizer, "first")
    for r in range(rebuilds):
        saved_model = {k: v.detach().clone() for k, v in model.state_dict().items()}
        state = optimizer.state_dict()
        saved_optim = {"param_groups": state["param_groups"], "state": {
            k: {n: t.clone() if torch.is_tensor(t) else t for n, t in v.items()}
            for k, v in state["state"].items()}}
        torch.distributed.barrier()
        start = time.perf_counter()
        del model, optimizer, state
        gc.collect()
        if trim:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        model, optimizer = build()
        model.load_state_dict(saved_model)
        optimizer.load_state_dict(saved_optim)
        del saved_model, saved_optim
        torch.distributed.barrier()
        rows.append({"phase": f"rebuild{r}", "wall_s": time.perf_counter() - start})
        run(model, optimizer, f"after{r}")


def _rank(rank: int, args: argparse.Namespace) -> None:
    import torch.distributed as dist  # noqa: PLC0415

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    rows: list = []
    thread = threading.Thread(target=_train, name="rr-train",
                              args=(args.size, args.steps, args.rebuilds, args.trim, rows))
    thread.start()
    thread.join()
    if rank == 0:
        with open(args.rows, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def _child(args: argparse.Namespace) -> None:
    import torch.multiprocessing as mp  # noqa: PLC0415

    sys.path.insert(0, os.path.dirname(HERE))
    mp.spawn(_rank, args=(args,), nprocs=2)


def _summary(rows: list) -> dict:
    """Median step per phase, and the first step after each rebuild over the steady step."""
    steady = [r["wall_s"] for r in rows if r["phase"] == "first" and r["step"] >= 2]
    firsts = [r for r in rows if r["phase"].startswith("after") and r["step"] == 0]
    later = [r["wall_s"] for r in rows if r["phase"].startswith("after") and r["step"] >= 1]
    return {"steady_step_s": statistics.median(steady),
            "after_rebuild_first_step_s": statistics.median(r["wall_s"] for r in firsts),
            "after_rebuild_later_step_s": statistics.median(later),
            "after_rebuild_first_step_faults": statistics.median(r["minor_faults"] for r in firsts),
            "steady_step_faults": statistics.median(
                r["minor_faults"] for r in rows if r["phase"] == "first" and r["step"] >= 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="200mb")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--rebuilds", type=int, default=2)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--out", help="result JSON")
    p.add_argument("--port", type=int, default=29533)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--trim", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rows", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        _child(args)
        return
    if not args.out:
        p.error("--out is required")
    started, runs = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), []
    for rep in range(args.reps):
        for name, (env, trim) in VARIANTS.items():
            rows_path = f"{args.out}.rows.json"
            cmd = [sys.executable, __file__, "--child", "--size", args.size, "--steps",
                   str(args.steps), "--rebuilds", str(args.rebuilds), "--port", str(args.port),
                   "--rows", rows_path] + (["--trim"] if trim else [])
            subprocess.run(cmd, env={**os.environ, **env}, check=True, timeout=900)
            with open(rows_path) as f:
                rows = json.load(f)
            os.unlink(rows_path)
            runs.append({"variant": name, "rep": rep, "env": env, "malloc_trim": trim,
                         "summary": _summary(rows), "rows": rows})
            print(json.dumps({"variant": name, "rep": rep, **runs[-1]["summary"]}), flush=True)
    doc = {"size": args.size, "steps": args.steps, "rebuilds": args.rebuilds,
           "reps": args.reps, "command": " ".join(["python", "jobs/bench/overhead/"
                                                   "rebuild_probe.py"] + sys.argv[1:]),
           "started": started, "runs": runs}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
