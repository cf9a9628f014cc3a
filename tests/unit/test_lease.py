"""The run lease on real storage, no Ray: a local folder (link/rename) and S3 (SeaweedFS, boto3
conditional writes). One holder at a time; a second job fails naming the holder, or waits; an
expired lease is taken over; a fenced holder cannot renew, commit or pass its fence."""

from __future__ import annotations

import threading
import time

import pytest

from ray_resilience._internal.checkpoint.format import layout
from ray_resilience._internal.checkpoint.format.commit import commit_step, read_manifest
from ray_resilience._internal.checkpoint.format.lease import LeaseConflict, acquire
from ray_resilience._internal.checkpoint.format.lease_backends import lease_backend
from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage
from ray_resilience.checkpoint.errors import LeaseLostError, RunInUseError

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["posix", "s3"])
def storage(request, tmp_path) -> CheckpointStorage:
    if request.param == "posix":
        storage = CheckpointStorage.for_run(str(tmp_path), "run")
    else:
        server = request.getfixturevalue("s3_server")
        storage = CheckpointStorage.for_run(server.uri(f"lease-{time.time_ns()}"), "run")
    storage.make_dir("")
    return storage


def test_a_second_job_fails_fast_naming_the_run_and_the_holder(storage):
    first = acquire(lease_backend(storage), run="run", ttl_s=60, wait_s=0)
    assert first.generation == 1
    started = time.monotonic()
    with pytest.raises(RunInUseError) as info:
        acquire(lease_backend(storage), run="run", ttl_s=60, wait_s=0)
    assert time.monotonic() - started < 5
    message = str(info.value)
    owner = first.record.owner
    assert "'run'" in message and f"pid {owner['pid']}" in message
    assert f"host {owner['host']}" in message and "expires" in message
    assert info.value.holder and info.value.run == "run"


def test_a_waiting_job_takes_the_run_once_the_holder_releases_it(storage):
    first = acquire(lease_backend(storage), run="run", ttl_s=60, wait_s=0)
    threading.Timer(1.0, first.release).start()
    second = acquire(lease_backend(storage), run="run", ttl_s=60, wait_s=30)
    assert second.generation == 2
    with pytest.raises(LeaseConflict):
        first.renew()  # a released lease cannot be renewed back


def test_an_expired_lease_is_taken_over_and_the_old_holder_is_fenced(storage):
    crashed = acquire(lease_backend(storage), run="run", ttl_s=1.0, wait_s=0)
    old_fence = crashed.fence()
    old_fence.check()
    time.sleep(1.2)  # the holder stopped renewing (it crashed, or froze)
    retry = acquire(lease_backend(storage), run="run", ttl_s=60, wait_s=0)
    assert retry.generation == 2
    with pytest.raises(LeaseConflict):
        crashed.renew()
    with pytest.raises(LeaseLostError) as info:
        old_fence.check()
    assert info.value.final and f"pid {retry.record.owner['pid']}" in str(info.value)
    step_dir = layout.StepDir(5, layout.make_session(1, 1))
    storage.make_dir(step_dir.name)
    with pytest.raises(LeaseLostError):  # a stale generation never commits
        commit_step(storage, step_dir, world_size=1, metadata=b"md", files={},
                    fence=old_fence.check)
    assert read_manifest(storage, step_dir) is None
    retry.fence().check()


def test_a_lease_not_renewed_in_time_stops_commits_before_it_can_expire(storage):
    held = acquire(lease_backend(storage), run="run", ttl_s=2.0, wait_s=0)
    fence = held.fence()
    fence.check()
    time.sleep(1.6)  # inside the last quarter of its life: a commit might outlast it
    with pytest.raises(LeaseLostError) as info:
        fence.check()
    assert not info.value.final
    held.renew()
    fence.check()


def test_racing_jobs_get_one_lease(storage):
    won, lost = [], []

    def race():
        try:
            won.append(acquire(lease_backend(storage), run="run", ttl_s=60, wait_s=0))
        except RunInUseError as exc:
            lost.append(exc)
    threads = [threading.Thread(target=race) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(won) == 1 and len(lost) == 5
    assert won[0].generation == 1
