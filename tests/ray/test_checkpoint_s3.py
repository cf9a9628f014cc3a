"""Checkpoints on a real S3 server (SeaweedFS on loopback): round trip, credentials, outages and
the in-flight policies while storage is down, a writer killed in the middle of a write, a
restore through a brief outage, and a second job of a run in use."""

from __future__ import annotations

import os
import threading
import time

import pytest
import ray

from ray_resilience._internal.checkpoint.service.service import CheckpointService
from ray_resilience.checkpoint import CheckpointConfig, RunInUseError, StoragePermissionError
from tests.support.checkpoint_harness import on_all, start_with, stop_ranks
from tests.support.checkpoint_service import assert_same, wait_committed

pytestmark = pytest.mark.timeout(400)
OUTAGE_CONFIG = dict(num_storage_retries=1000, storage_retry_backoff_s=0.2,
                     storage_retry_max_backoff_s=0.5)


def start_s3_service(server, prefix: str, world_size: int = 2, **config) -> CheckpointService:
    config.setdefault("local_interval_steps", 0)  # about storage: no local snapshot shadows it
    node = ray.get_runtime_context().get_node_id()
    return CheckpointService.start(
        storage_path=server.uri(prefix), run_name="run", storage_filesystem=None,
        world_size=world_size, node_ids_by_rank=[node] * world_size,
        config=CheckpointConfig(**config))


def keys(server, prefix: str) -> list[str]:
    listing = server.client().list_objects_v2(Bucket=server.bucket,
                                              Prefix=f"{prefix}/run/checkpoints/")
    return sorted(o["Key"].split("/checkpoints/")[1] for o in listing.get("Contents", []))


def wait_until(predicate, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def writing(ranks, step: int) -> bool:
    return all(s["writing_step"] == step for s in on_all(ranks, "stats"))


@pytest.fixture
def s3_run(ray_session, s3_server, request):
    """A service on S3 plus two ranks that committed step 1."""
    prefix = f"t-{request.node.name.replace('[', '-').replace(']', '')}-{time.time_ns()}"
    config = getattr(request, "param", {})
    service, ranks = start_with(
        lambda: start_s3_service(s3_server, prefix, **OUTAGE_CONFIG, **config))
    on_all(ranks, "train", 1, save=False)
    on_all(ranks, "save", 1)
    wait_committed(service, 1)
    yield service, ranks, prefix
    stop_ranks(ranks)
    service.shutdown()


def test_round_trip_on_s3_and_resume_from_storage(ray_session, s3_server):
    prefix = f"roundtrip-{time.time_ns()}"
    service, ranks = start_with(lambda: start_s3_service(s3_server, prefix, interval_steps=2))
    try:
        # Step 2 committed before step 4 is taken: on a busy machine the in-flight policy
        # (coalesce) may otherwise replace step 2's save with step 4's.
        for step in (2, 4):
            on_all(ranks, "train", 2)
            assert all(on_all(ranks, "wait_idle"))
            wait_committed(service, step)
        expected = on_all(ranks, "full_state")[0]
        stats = (service.stats(), on_all(ranks, "stats"))  # shown if an assertion below fails
    finally:
        stop_ranks(ranks)
        service.shutdown()
    files = [k for k in keys(s3_server, prefix) if k]  # "" is pyarrow's folder marker
    assert {k.split("/")[1] for k in files} == {
        "__0_0.distcp", "__1_0.distcp", "__0_extra.json", "__1_extra.json", "__0_items.json",
        "__1_items.json", ".metadata", "manifest.json"}
    assert len({k.split("/")[0] for k in files}) == 2, stats  # steps 2 and 4
    assert stats[0]["committed_steps"] == [4, 2], stats
    service, ranks = start_with(lambda: start_s3_service(s3_server, prefix, interval_steps=2))
    try:
        assert [(r["step"], r["tier"]) for r in on_all(ranks, "load")] == [(4, "storage")] * 2
        assert_same(expected, on_all(ranks, "full_state")[0])
    finally:
        stop_ranks(ranks)
        service.shutdown()


def test_read_only_credentials_fail_fast_naming_the_path(ray_session, s3_server, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.readonly_access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.readonly_secret_key)
    with pytest.raises(StoragePermissionError) as info:
        start_s3_service(s3_server, "readonly")
    assert f"{s3_server.bucket}/readonly/run/checkpoints" in str(info.value)
    assert "credentials" in str(info.value)


@pytest.mark.slow  # ~15 s; the skip and block outages run by default
def test_outage_coalesce_keeps_training_and_commits_the_newest_after(s3_run, s3_server):
    service, ranks, prefix = s3_run
    with s3_server.outage():
        on_all(ranks, "train", 1, save=False)
        assert all(b is not None for b in on_all(ranks, "save", 2))
        wait_until(lambda: writing(ranks, 2), "step 2 to be handed to the writer")
        for step in (3, 4, 5):  # storage is down: 3 is pending, 4 and 5 replace it
            on_all(ranks, "train", 1, save=False)
            assert all(b is not None for b in on_all(ranks, "save", step))
        wait_until(lambda: service.stats()["writers"][0]["retries"] >= 2, "the writer to retry")
        assert service.latest_committed_step() == 1
        expected = on_all(ranks, "full_state")[0]
    stats = on_all(ranks, "stats")
    assert all(s["coalesced"] == 2 and s["pending_step"] == 5 for s in stats)
    assert all(on_all(ranks, "wait_idle"))
    wait_committed(service, 5)
    assert service.stats()["committed_steps"] == [5, 2]  # 3 and 4 were coalesced away, 1 pruned
    commits = service.stats()["commit_times"]  # (step, time) in commit order, pruned included
    assert [step for step, _ in commits] == [1, 2, 5]
    assert [t for _, t in commits] == sorted(t for _, t in commits)
    never_written = ("step_000000000003_", "step_000000000004_")
    assert not any(k.startswith(never_written) for k in keys(s3_server, prefix))
    loaded = on_all(ranks, "load")
    assert [r["step"] for r in loaded] == [5, 5]
    assert_same(expected, on_all(ranks, "full_state")[0])


@pytest.mark.parametrize("s3_run", [{"in_flight_policy": "skip"}], indirect=True)
def test_outage_skip_drops_new_saves_while_busy(s3_run, s3_server):
    service, ranks, _ = s3_run
    with s3_server.outage():
        on_all(ranks, "save", 2)
        wait_until(lambda: writing(ranks, 2), "step 2 to be handed to the writer")
        assert on_all(ranks, "save", 3) == [None, None]
        assert on_all(ranks, "save", 4) == [None, None]
    assert all(s["skipped"] == 2 for s in on_all(ranks, "stats"))
    assert all(on_all(ranks, "wait_idle"))
    wait_committed(service, 2)


@pytest.mark.parametrize("s3_run", [{"in_flight_policy": "block"}], indirect=True)
def test_outage_block_waits_for_storage(s3_run, s3_server):
    service, ranks, _ = s3_run
    with s3_server.outage():
        on_all(ranks, "save", 2)
        wait_until(lambda: writing(ranks, 2), "step 2 to be handed to the writer")
        blocked = [r.save.remote(3) for r in ranks]
        wait_until(lambda: service.stats()["writers"][0]["retries"] >= 3, "the writer to retry")
        ready, _ = ray.wait(blocked, num_returns=2, timeout=0)
        assert ready == []  # storage is down: the block policy holds the training thread
    assert all(b is not None for b in ray.get(blocked, timeout=120))
    assert all(on_all(ranks, "wait_idle"))
    wait_committed(service, 3)


def test_writer_killed_mid_write_loses_only_that_step(s3_run, s3_server):
    service, ranks, prefix = s3_run
    with s3_server.outage():
        on_all(ranks, "save", 2)
        wait_until(lambda: writing(ranks, 2), "step 2 to be handed to the writer")
        ray.kill(service.rank_spec(0).writer)  # in the middle of its (stalled) write
        wait_until(lambda: all(s["writing_step"] is None for s in on_all(ranks, "stats")),
                   "the ranks to notice the dead writer")
        assert service.latest_committed_step() == 1
    stats = on_all(ranks, "stats")
    assert all(s["failed"] == 1 and "died" in s["last_error"] for s in stats)
    on_all(ranks, "train", 1, save=False)
    on_all(ranks, "save", 3)  # training went on; the replaced writer takes the next save
    assert all(on_all(ranks, "wait_idle"))
    wait_committed(service, 3)
    assert 2 not in service.stats()["committed_steps"]
    assert not any(k.startswith("step_000000000002_") for k in keys(s3_server, prefix))
    assert [r["step"] for r in on_all(ranks, "load")] == [3, 3]


@pytest.mark.slow  # ~15 s
@pytest.mark.parametrize("s3_run", [{"memory_tier": False}], indirect=True)
def test_a_restore_during_a_brief_outage_retries_and_loads_the_newest_step(s3_run, s3_server):
    service, ranks, _ = s3_run
    on_all(ranks, "train", 1, save=False)
    on_all(ranks, "save", 2)
    wait_committed(service, 2)
    expected = on_all(ranks, "full_state")[0]
    on_all(ranks, "train", 1, save=False)
    s3_server.stop()
    loads = [r.load.remote() for r in ranks]  # reads fail while the endpoint is down...
    time.sleep(2.0)
    s3_server.start()  # ...and come back: the same step loads, not an older one
    loaded = ray.get(loads, timeout=180)
    assert [(r["step"], r["tier"], r["fallbacks"]) for r in loaded] == [(2, "storage", [])] * 2
    assert_same(expected, on_all(ranks, "full_state")[0])
    assert service.stats()["quarantined"] == {}


def test_a_second_job_of_a_run_in_use_fails_fast_and_touches_nothing(s3_run, s3_server):
    service, ranks, prefix = s3_run
    before = {o["Key"]: o["ETag"] for o in _objects(s3_server, prefix)}
    started = time.monotonic()
    with pytest.raises(RunInUseError) as info:
        start_s3_service(s3_server, prefix, **OUTAGE_CONFIG)
    assert time.monotonic() - started < 30
    assert "'run'" in str(info.value) and f"pid {os.getpid()}" in str(info.value)
    assert {o["Key"]: o["ETag"] for o in _objects(s3_server, prefix)} == before
    on_all(ranks, "train", 1, save=False)
    on_all(ranks, "save", 2)  # the first job goes on undisturbed
    wait_committed(service, 2)
    expected = on_all(ranks, "full_state")[0]
    assert [r["step"] for r in on_all(ranks, "load")] == [2, 2]
    assert_same(expected, on_all(ranks, "full_state")[0])


def _objects(server, prefix: str) -> list[dict]:
    listing = server.client().list_objects_v2(Bucket=server.bucket, Prefix=f"{prefix}/")
    return listing.get("Contents", [])


def test_a_waiting_job_takes_the_run_over_once_the_first_ends(ray_session, s3_server):
    prefix = f"waiting-{time.time_ns()}"
    first = start_s3_service(s3_server, prefix)
    box: dict = {}

    def second():
        box["service"] = start_s3_service(s3_server, prefix, lease_wait_s=120)
    waiter = threading.Thread(target=second)
    waiter.start()
    time.sleep(2.0)
    assert waiter.is_alive()  # waiting for the lease
    first.shutdown()  # releases the run
    waiter.join(150)
    taken = box["service"]
    try:
        assert taken.lease.generation == 2
    finally:
        taken.shutdown()
