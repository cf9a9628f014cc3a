"""End to end through `ResilientTrainer`: a second `fit()` with the same run name resumes from the
last committed checkpoint and ends bit-equal to an uninterrupted run."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import pytest
import torch

import ray_resilience as rr
from ray_resilience._internal.checkpoint.format.commit import committed_steps
from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage
from ray_resilience.checkpoint import CheckpointConfig
from ray_resilience.testing import Fault, FaultPlan
from tests.support import workload
from tests.support.procfs import descendants_named

pytestmark = pytest.mark.timeout(400)
INTERVAL = 3


def fit(data_dir: str, storage: str, name: str, max_steps: int) -> rr.Result:
    """tests/support/workload.py's loop (each rank's RNG stream is part of its checkpoint and of its
    loss), checkpoints every INTERVAL steps, no restarts."""
    resilience = rr.ResilienceConfig.disabled(checkpoint=CheckpointConfig(interval_steps=INTERVAL))
    return workload.fit(data_dir, storage, name, max_steps=max_steps, resilience=resilience)


@pytest.mark.slow  # ~35 s; test_checkpoint_ray.py's resumed run covers it by default
def test_second_fit_resumes_from_last_commit_and_matches_uninterrupted(clean_run, token_data_dir,
                                                                      tmp_path):
    store = str(tmp_path)
    clean = clean_run(2, 12)  # the session's uninterrupted run of the same loop
    first = fit(token_data_dir, store, "resumed", max_steps=8)
    assert first.ok, first.error
    assert all(v["resumed_from"] is None for v in first.return_values)
    storage = CheckpointStorage.for_run(store, "resumed")
    last = committed_steps(storage)[0].step
    assert last in (6, 3) and last % INTERVAL == 0  # step 8 is not a save step
    second = fit(token_data_dir, store, "resumed", max_steps=12)
    assert second.ok, second.error
    assert [v["resumed_from"] for v in second.return_values] == [last, last]
    assert [v["tier"] for v in second.return_values] == ["storage", "storage"]
    for rank in range(2):
        got, want = second.return_values[rank]["state"], clean.return_values[rank]["state"]
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in got), f"rank {rank} differs"
    assert os.path.isdir(os.path.join(store, "resumed", "checkpoints"))


def _has_torch(pid: int) -> bool:
    """Whether process `pid` has torch's library mapped (imported)."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8") as f:
            return "libtorch" in f.read()
    except OSError:
        return False  # gone meanwhile


def _a_new_writer_has_torch() -> Callable[[], bool]:
    """Whether a checkpoint writer of this session's Ray has imported torch since this was
    called. A process that had torch before does not count: a writer of an earlier test still
    exiting, or a pooled Ray worker that imported it for another task and now hosts the writer."""
    before = {pid for pid in descendants_named("") if _has_torch(pid)}
    return lambda: any(pid not in before and _has_torch(pid)
                       for pid in descendants_named("ray::CheckpointWriter"))


def _fit_held_at_step_4(until: Callable[[], bool], never: str, go: str, **fit_args) -> rr.Result:
    """`workload.fit(**fit_args)` with its ranks held at step 4 until `until()` holds (at most
    120 s, else the test fails with `never`), then let go by creating the file `go`."""
    box: dict = {}
    run = threading.Thread(target=lambda: box.update(result=workload.fit(
        hold_at_step=4, hold_file=go, **fit_args)))
    run.start()
    try:
        deadline = time.monotonic() + 120
        while not until():
            assert time.monotonic() < deadline, never
            time.sleep(0.1)
    finally:
        open(go, "w").close()
        run.join(timeout=200)
    return box["result"]


@pytest.mark.timeout(300)
def test_writers_import_dcp_only_after_the_first_step(ray_session, token_data_dir, tmp_path):
    """The writers' import of torch's DCP (~2 CPU-seconds) would slow the ranks' start-up on a
    small node: the supervisor starts it once the first step is done, though no save came yet
    (the ranks wait at step 4 until the writer has torch; no save comes in this run)."""
    go = str(tmp_path / "go")
    resilience = rr.ResilienceConfig.disabled(checkpoint=CheckpointConfig(interval_steps=100))
    result = _fit_held_at_step_4(_a_new_writer_has_torch(), "the writer never imported torch", go,
                                 data_dir=token_data_dir, storage=str(tmp_path), name="warm",
                                 max_steps=6, resilience=resilience)
    assert result.ok, result.error
    assert result.checkpoint["latest_committed_step"] is None
    loaded = max(p["t_end"] for p in result.phases
                 if p["phase"] == "checkpoint_load" and p["attempt"] == 0)
    (writer,) = result.checkpoint["stats"]["writers"]
    assert writer["dcp_import"] in ("importing", "done"), writer
    assert writer["dcp_import_started_at"] > loaded, (loaded, writer)
    imports = result.control["background_imports"]  # "auto" on CPU ranks: after the first step
    assert (imports["setting"], imports["when"]) == ("auto", "after_first_step"), imports
    assert "CPU ranks" in imports["reason"], imports


@pytest.mark.timeout(300)
def test_writers_import_dcp_with_the_ranks_when_told(ray_session, token_data_dir, tmp_path):
    """`background_imports="at_start"` (what "auto" picks on GPU nodes with idle cores): the
    writers start importing DCP when the ranks have started, before their first step."""
    resilience = rr.ResilienceConfig.disabled(checkpoint=CheckpointConfig(interval_steps=100),
                                              background_imports="at_start")
    result = workload.fit(data_dir=token_data_dir, storage=str(tmp_path), name="warm-early",
                          max_steps=3, resilience=resilience)
    assert result.ok, result.error
    first_step = min(m["time"] for m in result.metrics_history)
    (writer,) = result.checkpoint["stats"]["writers"]
    assert writer["dcp_import_started_at"] < first_step, (first_step, writer)
    assert result.control["background_imports"]["when"] == "at_start"


@pytest.mark.timeout(300)
def test_a_save_before_the_first_step_changes_nothing_and_restores_exactly(
        clean_run, token_data_dir, tmp_path):
    """`report(step=0, checkpoint=...)` before the optimizer ever stepped. Listing a stateless
    AdamW's state makes torch create it (a step count of 1): kept, every later step's bias
    correction was one step ahead. Only step 0 is committed (the ranks wait at step 4 until it
    is on storage), so the exception at step 8 restores it: the run must end bit-equal to the
    run without that save and without the fault."""
    store, go = str(tmp_path / "runs"), str(tmp_path / "go")
    storage = CheckpointStorage.for_run(store, "initial")
    plan = FaultPlan.explicit([Fault(step=8, rank=1, kind="exception")])
    resilience = rr.ResilienceConfig.default(
        fault_plan=plan, step_timeout_s=120.0, first_step_timeout_s=120.0,
        checkpoint=CheckpointConfig(interval_steps=100, local_interval_steps=0))
    result = _fit_held_at_step_4(
        lambda: os.path.isdir(storage.root) and bool(committed_steps(storage)),
        "step 0 was never committed", go, data_dir=token_data_dir, storage=store,
        name="initial", max_steps=12, resilience=resilience, save_initial=True)
    assert result.ok, result.error
    assert result.checkpoint["latest_committed_step"] == 0
    assert [v["resumed_from"] for v in result.return_values] == [0, 0]
    clean = clean_run(2, 12)
    for rank in range(2):
        workload.assert_bit_equal(result.return_values[rank]["state"],
                                  clean.return_values[rank]["state"])
