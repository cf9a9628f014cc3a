"""Foundation: FSDP2 training hosted on Ray actors, errors, teardown."""

from __future__ import annotations

import os
import time

import pytest
import ray._private.state as gcs
import torch

import ray_resilience as rr
from ray_resilience._internal.process_groups.heap import keeps_freed_memory
from ray_resilience._internal.rank.actor import WorkerActor
from ray_resilience._internal.supervisor.supervisor import Supervisor
from ray_resilience.errors import TrainingFailedError, WorkerError
from tests.support import workload

OUR_ACTOR_CLASSES = (WorkerActor.__name__, Supervisor.__name__)
"""Rank (and spare) actors and the supervisor, by the class names the GCS lists them under."""


def _our_leftovers(ray, *, within_s: float = 15.0) -> tuple[list, list]:
    """Live actors and placement groups of ours, read from the GCS (no dashboard needed); waits
    up to `within_s` for them to go (ray.kill and placement-group removal are asynchronous)."""
    deadline = time.monotonic() + within_s
    while True:
        actors = [a for a in gcs.actors().values()
                  if a["State"] != "DEAD" and a["ActorClassName"] in OUR_ACTOR_CLASSES]
        groups = [g for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]
        if (not actors and not groups) or time.monotonic() >= deadline:
            return actors, groups
        time.sleep(0.1)


def _alive(pid: int, *, within_s: float = 15.0) -> bool:
    """True if the process still exists after `within_s` (ray.kill is asynchronous)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.timeout(240)
def test_fsdp_matches_single_process_and_tears_down(clean_run, ray_session, token_data_dir):
    result = clean_run(2, 12)  # the session's fault-free run: 2 FSDP2 ranks, 12 steps
    assert result.ok, result.error
    losses = [m["loss"] for m in result.metrics_history if m["rank"] == 0]
    assert len(losses) == 12 and losses[-1] < losses[0] - 0.5  # measured 5.56 -> 4.56
    assert {(m["step"], m["rank"]) for m in result.metrics_history} == {
        (s, r) for s in range(1, 13) for r in range(2)}
    reference = workload.single_process_reference(token_data_dir, world_size=2, max_steps=12)
    for rank in range(2):
        state = result.return_values[rank]["state"]
        for name, tensor in reference.items():
            # FSDP averages the two ranks' gradients in another order than one big batch does:
            # equal up to float32 rounding, not bit for bit (measured max diff ~1e-5).
            torch.testing.assert_close(state[name], tensor, rtol=1e-4, atol=5e-5, msg=name)
    assert os.path.exists(os.path.join(result.path, "results.json"))
    actors, groups = _our_leftovers(ray_session)
    assert not actors and not groups
    assert not any(_alive(pid) for pid in result.worker_pids)


@pytest.mark.timeout(120)
def test_user_exception_fails_with_type_rank_and_traceback(ray_session, token_data_dir, tmp_path):
    def broken(cfg):
        if rr.get_context().world_rank == 1:
            raise KeyError("no such column: 'tokens_v2'")
        import torch.distributed as dist  # noqa: PLC0415 - runs on the rank

        dist.barrier()

    trainer = rr.ResilientTrainer(
        broken, scaling_config=rr.ScalingConfig(num_workers=2),
        run_config=rr.RunConfig(name="broken", storage_path=str(tmp_path), verbose=False),
        resilience=rr.ResilienceConfig.disabled())
    with pytest.raises(TrainingFailedError) as failed:
        trainer.fit()
    result = failed.value.result
    assert not result.ok and result.state == "failed"
    err = result.error
    assert failed.value.__cause__ is err and "KeyError" in str(failed.value)
    assert isinstance(err, WorkerError) and err.ranks == [1]
    assert isinstance(err.cause, KeyError) and err.exc_type == "KeyError"
    assert "tokens_v2" in str(err) and "in broken" in err.traceback
    actors, groups = _our_leftovers(ray_session)
    assert not actors and not groups
    assert not any(_alive(pid) for pid in result.worker_pids)


@pytest.mark.timeout(60)
def test_context_and_env_vars(ray_session, tmp_path, monkeypatch):
    keep = str(1 << 30)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", keep)  # the driver's allocator settings

    def loop():

        ctx = rr.get_context()
        return {"rank": ctx.world_rank, "world": ctx.world_size, "local": ctx.local_rank,
                "node": ctx.node_rank, "attempt": ctx.attempt, "device": str(ctx.device),
                "env": {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                   "MASTER_ADDR", "MASTER_PORT")},
                "nice": os.getpriority(os.PRIO_PROCESS, 0),
                "trim": os.environ.get("MALLOC_TRIM_THRESHOLD_"), "keeps": keeps_freed_memory()}

    result = rr.ResilientTrainer(
        loop, scaling_config=rr.ScalingConfig(num_workers=2),
        run_config=rr.RunConfig(name="ctx", storage_path=str(tmp_path), verbose=False),
        resilience=rr.ResilienceConfig.disabled()).fit()  # no checkpoint service to start
    assert result.ok, result.error
    for rank, value in enumerate(result.return_values):
        assert value["rank"] == rank and value["world"] == 2 and value["local"] == rank
        assert value["node"] == 0 and value["attempt"] == 0 and value["device"] == "cpu"
        assert value["env"]["RANK"] == str(rank) and value["env"]["WORLD_SIZE"] == "2"
        assert value["nice"] == 0  # as under torchrun, not the nice 15 Ray gives its workers
        # reach the rank processes, whose teardown then leaves freed memory for the next attempt
        assert value["trim"] == keep and value["keeps"] == "MALLOC_TRIM_THRESHOLD_"
    envs = [value["env"] for value in result.return_values]
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
    # The start-up is timed: the supervisor's steps and each rank process's, in order.
    timed = {(p["phase"], p["rank"]): p for p in result.phases if p["attempt"] == 0}
    assert {"placement", "start_workers"} <= {name for name, _ in timed}
    for rank in (0, 1):
        boot, imports, warm, pg = (timed[(name, rank)] for name in (
            "process_start", "imports", "prewarm", "init_process_group"))
        assert boot["t_start"] <= boot["t_end"] <= imports["t_start"] < imports["t_end"]
        assert imports["t_end"] <= warm["t_start"] < warm["t_end"] <= pg["t_start"]


def test_report_outside_training_is_a_clear_error():
    with pytest.raises(RuntimeError, match="outside a training function"):
        rr.report({"loss": 1.0}, step=1)
