"""One writer per run, end to end. Two jobs of one run name on one Ray cluster (separate drivers,
like two `ray job submit`s): the second fails fast naming the holder, or waits and takes over
once the first ended, and the first ends bit-equal with its checkpoints untouched. A crashed
job's run is taken over by its retry once the lease expired. A job whose run was taken over
commits and deletes nothing, not even after its coordinator restarted."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
import ray
from ray._private import state as ray_state

import ray_resilience as rr
from ray_resilience._internal.checkpoint.format import layout
from ray_resilience._internal.checkpoint.format.commit import commit_step, committed_steps
from ray_resilience._internal.checkpoint.format.lease import acquire
from ray_resilience._internal.checkpoint.format.lease_backends import lease_backend
from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage
from ray_resilience.checkpoint import CheckpointConfig
from tests.support import second_driver, workload
from tests.support.checkpoint_harness import on_all, start_with, stop_ranks
from tests.support.checkpoint_service import start_service, wait_committed, wait_dropped

pytestmark = pytest.mark.timeout(600)


def _newest(storage: CheckpointStorage) -> int | None:
    steps = committed_steps(storage)
    return steps[0].step if steps else None


def _wait_until(predicate, what: str, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _files(root: str) -> dict[str, tuple[int, int]]:
    """Every file under `root` but the lease (renewed meanwhile): (size, mtime in ns)."""
    found = {}
    for folder, _, names in os.walk(root):
        for name in names:
            if name.startswith("lease-"):
                continue
            info = os.stat(os.path.join(folder, name))
            found[os.path.relpath(os.path.join(folder, name), root)] = (info.st_size,
                                                                        info.st_mtime_ns)
    return found


def _alive_supervisors() -> int:
    return sum(1 for a in ray_state.actors().values()
               if a["ActorClassName"] == "Supervisor" and a["State"] == "ALIVE")


def _lease_file(storage: CheckpointStorage, generation: int) -> dict:
    with open(os.path.join(os.path.dirname(storage.root), f"lease-{generation}.json")) as f:
        return json.load(f)


@pytest.mark.slow  # ~6 min: two drivers; tests/ray/test_checkpoint_s3.py covers fail-fast
def test_a_second_job_fails_fast_and_a_waiting_one_takes_over_after(clean_run, token_data_dir,
                                                                     tmp_path):
    clean = clean_run(2, 12)
    store, go = str(tmp_path / "runs"), str(tmp_path / "go")
    storage = CheckpointStorage.for_run(store, "shared")
    address = ray.get_runtime_context().gcs_address
    job = {"data_dir": token_data_dir, "storage": store, "name": "shared"}
    log = str(tmp_path / "drivers.log")
    box: dict = {}
    first = threading.Thread(target=lambda: box.update(result=workload.fit(
        token_data_dir, store, "shared", max_steps=12, hold_at_step=6, hold_file=go,
        resilience=rr.ResilienceConfig.disabled(
            checkpoint=CheckpointConfig(interval_steps=2), step_timeout_s=400.0,
            first_step_timeout_s=400.0))))
    first.start()
    try:
        _wait_until(lambda: _newest(storage) == 6, "the first job's commit of step 6")
        run_folder = os.path.dirname(storage.root)
        before = _files(run_folder)
        holder = lease_backend(storage).read()[0]
        refused = second_driver.outcome(second_driver.launch(address, log=log, **job))
        assert refused["error_type"] == "RunInUseError", refused
        assert "'shared'" in refused["error"] and f"pid {holder.owner['pid']}" in refused["error"]
        assert f"host {holder.owner['host']}" in refused["error"]
        assert refused["worker_pids"] == [] and refused["ended"] - refused["started"] < 60
        after = _files(run_folder)
        # Not one of the first job's files touched; its own metrics log grows meanwhile (its
        # supervisor flushes it every few seconds), never shrinks (the refused job truncated it).
        assert after.pop("metrics.jsonl")[0] >= before.pop("metrics.jsonl")[0]
        assert after == before
        waiting = second_driver.launch(address, log=log, **job, checkpoint={"lease_wait_s": 300})
        second_driver.wait_started(waiting)
        _wait_until(lambda: _alive_supervisors() == 2, "the waiting job's supervisor")
        time.sleep(2.0)  # it is claiming the run now: it waits
    finally:
        open(go, "w").close()
        first.join(500)
    result = box["result"]
    assert result.ok, result.error
    for rank in range(2):
        workload.assert_bit_equal(result.return_values[rank]["state"],
                                  clean.return_values[rank]["state"])
    taken = second_driver.outcome(waiting)
    released_at = _lease_file(storage, 1)["renewed_at"]
    assert _lease_file(storage, 1)["released"] and taken["started"] < released_at
    assert taken["ok"] and taken["resumed_from"] == [12, 12], taken
    assert _lease_file(storage, 2)["acquired_at"] >= released_at


@pytest.mark.slow  # ~8 min: waits out a lease
def test_a_crashed_jobs_retry_takes_the_run_over_once_its_lease_expired(clean_run,
                                                                        token_data_dir,
                                                                        tmp_path):
    clean = clean_run(2, 12)
    store = str(tmp_path / "runs")
    storage = CheckpointStorage.for_run(store, "retried")
    log = str(tmp_path / "driver.log")
    crashed = second_driver.launch(
        ray.get_runtime_context().gcs_address, log=log, data_dir=token_data_dir, storage=store,
        name="retried", checkpoint={"lease_ttl_s": 5.0},
        cfg={"hold_at_step": 6, "hold_file": str(tmp_path / "never")})
    try:
        _wait_until(lambda: second_driver.alive(crashed, log) and _newest(storage) == 6,
                    "the first job's commit of step 6")
    finally:
        os.kill(crashed.pid, signal.SIGKILL)  # the driver dies: Ray ends its job's actors
        crashed.wait(60)
    retry = workload.fit(token_data_dir, store, "retried", max_steps=12,
                         resilience=rr.ResilienceConfig.disabled(checkpoint=CheckpointConfig(
                             interval_steps=2, lease_wait_s=120)))
    assert retry.ok, retry.error
    assert [v["resumed_from"] for v in retry.return_values] == [6, 6]
    for rank in range(2):
        workload.assert_bit_equal(retry.return_values[rank]["state"],
                                  clean.return_values[rank]["state"])
    old, new = _lease_file(storage, 1), _lease_file(storage, 2)
    assert not old["released"] and old["expires_at"] <= new["acquired_at"]


def test_a_job_whose_run_was_taken_over_commits_and_deletes_nothing(ray_session, tmp_path):
    root = str(tmp_path)
    service, ranks = start_with(lambda: start_service(root, 2, memory_tier=False,
                                                      lease_ttl_s=2.0))
    try:
        on_all(ranks, "save", 1)
        assert all(on_all(ranks, "wait_idle"))
        wait_committed(service, 1)
        service.lease.close(release=False)  # this job stops renewing (frozen, cut off)
        time.sleep(2.5)
        storage = CheckpointStorage.for_run(root, "run")
        newer = acquire(lease_backend(storage), run="run", ttl_s=60, wait_s=0)
        assert newer.generation == 2
        theirs = layout.make_session(2, 1)
        for step, done in ((7, True), (8, False)):  # the new job's commit, and one in flight
            folder = layout.StepDir(step, theirs)
            storage.make_dir(folder.name)
            if done:
                commit_step(storage, folder, world_size=1, metadata=b"md", files={})
        before = {k: v for k, v in _files(storage.root).items()
                  if theirs in k or k.startswith("step_000000000001_")}
        assert len(before) >= 5  # their commit and folder in flight, our step 1
        on_all(ranks, "save", 2)
        assert all(on_all(ranks, "wait_idle"))
        dropped = wait_dropped(service, 2)
        assert [d["kind"] for d in dropped] == ["fenced"]
        assert f"pid {newer.record.owner['pid']}" in dropped[0]["reason"]
        assert service.poll(0)["fenced"].final
        incarnation = service.poll(0)["incarnation"]
        ray.kill(service._coordinator, no_restart=False)  # its restart prunes first thing...
        _wait_until(lambda: service.poll(0)["incarnation"] != incarnation, "a restart", 120)
        after = _files(storage.root)
        assert {k: after.get(k) for k in before} == before  # ...nothing: it was fenced
        assert [d.step for d in committed_steps(storage, generation=2)][:2] == [7, 1]
    finally:
        stop_ranks(ranks)
        service.shutdown()
