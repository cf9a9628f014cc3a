"""A Ray Train-style driver (ray.train configs, a Ray Dataset), unchanged but for the trainer
class, ends bit-equal to the fault-free run after an exception (docs/ray_train_port.md): the
dataset shard resumes at the next batch, or the weights would differ."""

from __future__ import annotations

import os
import runpy

import pytest
import torch

from tests.support.workload import assert_bit_equal

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PORT = os.path.join(ROOT, "jobs", "ray_train_port", "resilient_fsdp.py")


@pytest.mark.timeout(600)
def test_the_ported_driver_ends_bit_equal_after_an_exception(ray_session, tmp_path):
    # Run as a script is: its train loop travels to the ranks by value, not by module name.
    port = runpy.run_path(PORT, run_name="resilient_fsdp_port")
    runs = {}
    for label, extra in (("clean", []), ("fault", ["--fail_at_step", "4"])):
        storage = tmp_path / label
        storage.mkdir()
        result = port["main"](["--storage_path", str(storage), "--steps", "6"] + extra)
        runs[label] = (result, torch.load(storage / "final.pt", weights_only=True))
    clean, fault = runs["clean"][0], runs["fault"][0]
    assert clean.attempts == 1 and not clean.faults
    assert fault.attempts == 2 and [f["cause"] for f in fault.faults] == ["exception"]
    assert "transient failure at step 4" in fault.faults[0]["error"]
    assert [m["step"] for m in fault.metrics_history if m["rank"] == 0] == [1, 2, 3, 4, 5, 6]
    assert_bit_equal(runs["clean"][1], runs["fault"][1])
