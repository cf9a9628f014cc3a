"""The tiny LLaMA workload the integration tests train, and how to compare final weights."""

from __future__ import annotations

import os
import signal
import time

import torch
from torch.distributed.fsdp import fully_shard

import ray_resilience as rr
from ray_resilience.examples.llama import build_model, build_sharded, causal_lm_loss, load_or_init
from ray_resilience.examples.token_data import TokenDataset

BATCH_SIZE = 4
LR = 3e-3
RNG_SEED = 1000
NOISE = 1e-3
"""Each rank scales its loss by 1 + NOISE x a draw from its own torch RNG stream, saved with every
checkpoint: a resume that does not restore each rank's RNG exactly is not bit-equal."""


def train_loop(cfg: dict) -> dict:
    """FSDP2 LLaMA (`preset`, default tiny; optional `batch_size`, `seq_len`); returns the full
    (gathered) state dict and this rank's process."""
    ctx = rr.get_context()
    preset = cfg.get("preset", "tiny")
    batch_size, seq_len = cfg.get("batch_size", BATCH_SIZE), cfg.get("seq_len")
    if cfg.get("meta_init"):  # shards allocated, filled by the checkpoint or the seed's weights
        model = build_sharded(preset)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
        loaded = load_or_init(model, optimizer, seed=0)
    else:
        model = build_model(preset, seed=0)
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
        loaded = rr.load_checkpoint(model=model, optimizer=optimizer)
    data = TokenDataset(cfg["data_dir"])
    torch.manual_seed(RNG_SEED + ctx.world_rank)
    start = 0
    if loaded is not None:
        start = loaded.step
        torch.set_rng_state(loaded.extra["rng"])
    elif cfg.get("save_initial"):  # the initial state, before the optimizer's first step
        rr.report({}, step=0, checkpoint=rr.CheckpointState(model, optimizer, extra={
            "data_step": 0, "rng": torch.get_rng_state()}))
    for step in range(start + 1, cfg["max_steps"] + 1):
        inputs, targets = data.batch(step - 1, ctx.world_rank, ctx.world_size, batch_size)
        if seq_len:
            inputs, targets = inputs[:, :seq_len], targets[:, :seq_len]
        noise = torch.rand(()).item()
        loss = causal_lm_loss(model(inputs), targets) * (1.0 + NOISE * noise)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cfg.get("sleep_s"):
            time.sleep(cfg["sleep_s"])
        if ctx.attempt == 0 and cfg.get("stop_at") == (ctx.world_rank, step):
            from ray_resilience.testing.fire import stop_process  # noqa: PLC0415 - one test's fault

            stop_process()  # the whole process freezes: no heartbeat, no report
        rr.report({"loss": loss.item()}, step=step,
                  checkpoint=rr.CheckpointState(model, optimizer, extra={
                      "data_step": step, "rng": torch.get_rng_state()}))
        if cfg.get("touch_after_step") == step:  # an in-place write the save's copy sees
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(1.0)  # values unchanged, versions moved: the save is torn
        if cfg.get("hold_at_step") == step:  # until the test lets the run go on
            _wait_for(cfg["hold_file"], timeout_s=cfg.get("hold_timeout_s", 300.0))
        if cfg.get("kill_coordinator_at_step") == step and ctx.world_rank == 0 \
                and not os.path.exists(cfg["marker"]):
            _kill_coordinator(cfg["marker"])
        if cfg.get("validate_every") and step % cfg["validate_every"] == 0:
            with rr.phase("validation"), torch.no_grad():  # changes no parameter
                model(inputs)
                time.sleep(cfg.get("validation_sleep_s", 0.0))
    full = {k: v.full_tensor() for k, v in model.state_dict().items()}
    import psutil  # noqa: PLC0415 - when this rank's process started (a Ray dependency)
    import ray  # noqa: PLC0415 - the node this rank finished on

    marker = cfg.get("marker")
    killed = None
    if marker and os.path.exists(marker):
        with open(marker) as f:
            killed = int(f.read())
    return {"state": full, "pid": os.getpid(), "attempt": ctx.attempt,
            "killed_coordinator": killed,
            "resumed_from": loaded.step if loaded else None,
            "tier": loaded.tier if loaded else None,
            "node_id": ray.get_runtime_context().get_node_id(),
            "started_at": psutil.Process().create_time()}


def _kill_coordinator(marker: str) -> None:
    """SIGKILLs the run's commit coordinator process, once per run (`marker` holds its pid)."""
    import ray  # noqa: PLC0415 - runs on a rank

    from ray_resilience import context  # noqa: PLC0415 - the rank's own checkpointer

    coordinator = context._session.checkpointer.spec.coordinator
    pid = ray.get(coordinator.stats.remote(), timeout=120)["pid"]
    with open(marker, "w") as f:
        f.write(str(pid))
    os.kill(pid, signal.SIGKILL)


def _wait_for(path: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s} s")
        time.sleep(0.1)


def single_process_reference(data_dir: str, *, world_size: int, max_steps: int) -> dict:
    """The same training without FSDP in one process: every rank's batch and loss scale (drawn
    from that rank's RNG stream), their mean as the loss, one optimizer."""
    model = build_model("tiny", seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    data = TokenDataset(data_dir)
    streams = [torch.Generator().manual_seed(RNG_SEED + r) for r in range(world_size)]
    for step in range(1, max_steps + 1):
        loss = torch.zeros(())
        for rank in range(world_size):
            inputs, targets = data.batch(step - 1, rank, world_size, BATCH_SIZE)
            scale = 1.0 + NOISE * torch.rand((), generator=streams[rank]).item()
            loss = loss + causal_lm_loss(model(inputs), targets) * scale
        (loss / world_size).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def fit(data_dir: str, storage: str, name: str, *, num_workers: int = 2, max_steps: int = 12,
        resilience: rr.ResilienceConfig | None = None, raise_on_failure: bool = True,
        **cfg) -> rr.Result:
    return rr.ResilientTrainer(
        train_loop, train_loop_config={"data_dir": data_dir, "max_steps": max_steps, **cfg},
        scaling_config=rr.ScalingConfig(num_workers=num_workers),
        run_config=rr.RunConfig(name=name, storage_path=storage, verbose=False),
        resilience=resilience or rr.ResilienceConfig.disabled(),
    ).fit(raise_on_failure=raise_on_failure)


def assert_bit_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    diff = [k for k in a if not torch.equal(a[k], b[k])]
    assert not diff, f"parameters differ from the fault-free run: {diff}"
