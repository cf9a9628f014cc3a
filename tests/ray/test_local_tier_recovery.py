"""Recovery at a real shard size with the defaults: ~200 MB of parameters and AdamW state per
rank, `ResilienceConfig.default()` with committed saves every 100 steps as a user would set them.
An exception and a SIGKILL each redo at most the local interval the run chose (reported in
`Result`) and the run ends bit-equal to the fault-free one."""

from __future__ import annotations

import glob
import os

import pytest

import ray_resilience as rr
from ray_resilience.testing import Fault, FaultPlan
from tests.support import workload

pytestmark = pytest.mark.timeout(900)
SHAPE = {"preset": "small", "batch_size": 1, "seq_len": 16}
"""The benchmark's 200mb size: ~190 MB of fp32 state per rank with 2 ranks."""
STEPS = 24
CHECKPOINT_INTERVAL = 100


def _fit(data_dir: str, storage: str, name: str, plan: FaultPlan | None) -> rr.Result:
    resilience = rr.ResilienceConfig.default(checkpoint_interval=CHECKPOINT_INTERVAL,
                                             fault_plan=plan)
    return workload.fit(data_dir, storage, name, max_steps=STEPS, resilience=resilience,
                        **SHAPE)


def _interval_at(result: rr.Result, t_fault: float) -> int:
    """The interval in force at `t_fault`: the newest decision made before it."""
    decisions = result.checkpoint["local_tier"]["decisions"]
    before = [d for d in decisions if d["t_start"] <= t_fault and not d["off"]]
    assert before, (decisions, t_fault)
    return before[-1]["interval_steps"]


@pytest.mark.slow  # ~2-10 min: ~200 MB per rank
def test_an_exception_and_a_sigkill_redo_at_most_the_local_interval(ray_session, token_data_dir,
                                                                      tmp_path):
    clean = _fit(token_data_dir, str(tmp_path), "clean200", None)
    assert clean.ok, clean.error
    plan = FaultPlan.explicit([Fault(step=11, rank=1, kind="exception"),
                               Fault(step=19, rank=1, kind="sigkill")])
    result = _fit(token_data_dir, str(tmp_path), "faults200", plan)
    assert result.ok, result.error
    for rank in range(2):
        workload.assert_bit_equal(result.return_values[rank]["state"],
                                  clean.return_values[rank]["state"])

    local = result.checkpoint["local_tier"]
    assert result.local_interval_steps == local["interval_steps"] >= 1
    assert local["state_bytes"] > 150e6 and local["off"] is None
    faults = result.goodput.faults
    assert [f["cause"] for f in result.faults] == ["exception", "actor_died"], result.faults
    for fault, detected in zip(faults, result.faults, strict=True):
        assert fault.checkpoint_tier == "local", fault
        interval = _interval_at(result, detected["t_fault"])
        assert 0 <= fault.steps_redone <= interval, (fault, local)
    assert result.checkpoint["latest_committed_step"] is None  # no save step was reached
    assert set(result.checkpoint["restore_s"]) == {"local"}
    assert not glob.glob(os.path.join("/dev/shm", "ray_resilience", "faults200-*"))


@pytest.mark.slow  # ~1-5 min: ~200 MB per rank
def test_a_meta_built_model_restores_without_a_full_init_and_ends_bit_equal(clean_run,
                                                                           token_data_dir,
                                                                           tmp_path):
    """`build_sharded` + `load_or_init` (examples/llama.py): the first attempt starts from the
    seed's weights, each restart fills the uninitialized shards from the local tier; the run
    ends bit-equal to the one built unsharded on the CPU."""
    plan = FaultPlan.explicit([Fault(step=5, rank=1, kind="exception"),
                               Fault(step=9, rank=0, kind="exception")])
    resilience = rr.ResilienceConfig.default(fault_plan=plan, step_timeout_s=30.0)
    result = workload.fit(token_data_dir, str(tmp_path), "meta", max_steps=12,
                          resilience=resilience, meta_init=True)
    assert result.ok, result.error
    assert [v["tier"] for v in result.return_values] == ["local", "local"]
    for rank in range(2):
        workload.assert_bit_equal(result.return_values[rank]["state"],
                                  clean_run(2, 12).return_values[rank]["state"])
