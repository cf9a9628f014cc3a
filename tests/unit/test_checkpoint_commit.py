"""Commit protocol, retention, cleanup and storage errors on real local file systems (no Ray)."""

from __future__ import annotations

import json
import os
import threading
import zlib

import pytest

from ray_resilience._internal.checkpoint.format import checksum, layout
from ray_resilience._internal.checkpoint.format.commit import (
    Manifest,
    commit_step,
    committed_steps,
    prune,
    read_manifest,
)
from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage, retrying
from ray_resilience._internal.checkpoint.service.commit_queue import CommitQueue
from ray_resilience._internal.checkpoint.wire import FileDigest
from ray_resilience.checkpoint.errors import (
    CheckpointCorruptError,
    StorageFullError,
    StoragePermissionError,
    StorageUnavailableError,
    UnsafeCheckpointError,
)
from tests.support.tmpfs import tmpfs

pytestmark = pytest.mark.timeout(60)
OLD, NEW = "00001000000001aa", "00001000000002bb"  # lease generation 1: sessions 1 and 2
NEXT_JOB = "00002000000003cc"  # generation 2: a job that took the run over


def _fake_step(storage: CheckpointStorage, step: int, session: str, *,
               commit: bool) -> layout.StepDir:
    step_dir = layout.StepDir(step, session)
    storage.make_dir(step_dir.name)
    with storage.open_output(f"{step_dir.name}/__0_0.distcp") as out:
        out.write(b"data" * 10)
    if commit:
        commit_step(storage, step_dir, world_size=1, metadata=b"md",
                    files={"__0_0.distcp": FileDigest(40, 0)})
    return step_dir


@pytest.fixture
def storage(tmp_path) -> CheckpointStorage:
    return CheckpointStorage.for_run(str(tmp_path), "run")


def test_only_folders_with_a_manifest_count(storage):
    _fake_step(storage, 10, NEW, commit=True)
    _fake_step(storage, 20, NEW, commit=False)
    _fake_step(storage, 5, NEW, commit=True)
    os.makedirs(storage.path("not_a_step"))
    assert [d.step for d in committed_steps(storage)] == [10, 5]
    manifest = read_manifest(storage, layout.StepDir(10, NEW))
    assert manifest.world_size == 1 and set(manifest.files) == {"__0_0.distcp", ".metadata"}
    assert read_manifest(storage, layout.StepDir(20, NEW)) is None


def test_atomic_writes_leave_no_temporary_files(storage):
    step_dir = _fake_step(storage, 10, NEW, commit=True)
    assert sorted(os.listdir(storage.path(step_dir.name))) \
        == [".metadata", "__0_0.distcp", "manifest.json"]


def test_prune_keeps_newest_and_in_flight_and_removes_leftovers(storage):
    for step in (10, 20, 30):
        _fake_step(storage, step, NEW, commit=True)
    leftover_old_session = _fake_step(storage, 40, OLD, commit=False)
    abandoned = _fake_step(storage, 25, NEW, commit=False)
    in_flight = _fake_step(storage, 40, NEW, commit=False)
    deleted = prune(storage, num_to_keep=2, generation=1, session=NEW)
    assert set(deleted) == {layout.StepDir(10, NEW), leftover_old_session, abandoned}
    assert set(storage.list_step_dirs()) \
        == {layout.StepDir(20, NEW), layout.StepDir(30, NEW), in_flight}


def test_a_restarted_coordinator_keeps_its_generations_folders_until_it_knows_the_session(
        storage):
    older_job = _fake_step(storage, 50, "00000000000009dd", commit=False)  # generation 0
    _fake_step(storage, 10, NEW, commit=True)
    ours = _fake_step(storage, 20, NEW, commit=False)  # may be in flight: its session is unknown
    assert prune(storage, num_to_keep=2, generation=1, session=None) == [older_job]
    assert storage.list_step_dirs() == [layout.StepDir(10, NEW), ours]


def test_retention_never_deletes_a_newer_generations_folders(storage):
    """A job whose lease was taken over (it is fenced before pruning) still cannot delete what
    the job after it wrote, even in the instant between its lease check and the deletion."""
    newer = [_fake_step(storage, step, NEXT_JOB, commit=True) for step in (5, 6, 7)]
    newer.append(_fake_step(storage, 8, NEXT_JOB, commit=False))
    _fake_step(storage, 30, NEW, commit=True)
    assert prune(storage, num_to_keep=2, generation=1, session=NEW) == []
    assert set(newer) <= set(storage.list_step_dirs())


def test_the_timeline_orders_commits_not_the_step_number(storage):
    """An attempt that rolled back (step 120 would not load) resumed from 100 and committed 105:
    105 is the newest commit of the run, so a later restore loads it, and retention keeps it."""
    for step in (100, 110, 120):
        _fake_step(storage, step, OLD, commit=True)
    _fake_step(storage, 105, NEW, commit=True)
    assert [d.step for d in committed_steps(storage)] == [105, 120, 110, 100]
    deleted = prune(storage, num_to_keep=2, generation=1, session=NEW)
    assert {d.step for d in deleted} == {110, 100}
    assert [d.step for d in committed_steps(storage)] == [105, 120]


def test_quarantined_steps_do_not_count_against_num_to_keep(storage):
    for step in (10, 20, 30):
        _fake_step(storage, step, NEW, commit=True)
    bad = layout.StepDir(30, NEW)
    deleted = prune(storage, num_to_keep=2, generation=1, session=NEW, quarantined={bad})
    assert deleted == []  # 30 is kept but counts for nothing: 20 and 10 are the two loadable
    _fake_step(storage, 40, NEW, commit=True)
    assert set(prune(storage, num_to_keep=2, generation=1, session=NEW, quarantined={bad})) \
        == {layout.StepDir(10, NEW)}


def test_folders_from_before_session_ids_carried_a_generation_sort_oldest(storage):
    legacy = _fake_step(storage, 500, "f3c9a1b2c3d4e5f6", commit=True)  # a random old session
    _fake_step(storage, 10, NEW, commit=True)
    assert committed_steps(storage, generation=1) == [layout.StepDir(10, NEW), legacy]
    assert prune(storage, num_to_keep=1, generation=1, session=NEW) == []  # never ours to delete


def test_a_fence_that_refuses_leaves_the_step_uncommitted(storage):
    from ray_resilience.checkpoint.errors import LeaseLostError  # noqa: PLC0415 - new in the fix

    step_dir = layout.StepDir(10, NEW)
    storage.make_dir(step_dir.name)

    def lost():
        raise LeaseLostError("run", "lease", "the run was taken over")
    with pytest.raises(LeaseLostError):
        commit_step(storage, step_dir, world_size=1, metadata=b"md", files={}, fence=lost)
    assert read_manifest(storage, step_dir) is None and committed_steps(storage) == []


@pytest.mark.parametrize("edit, error", [
    (lambda m: m.replace(b'"__0_0.distcp"', b'"../../x"'), UnsafeCheckpointError),
    (lambda m: m.replace(b'"step": 10', b'"step": 11'), CheckpointCorruptError),
    (lambda m: m[:20], CheckpointCorruptError),
])
def test_tampered_manifest_is_refused(storage, edit, error):
    step_dir = _fake_step(storage, 10, NEW, commit=True)
    path = storage.path(f"{step_dir.name}/manifest.json")
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(edit(data))
    with pytest.raises(error):
        read_manifest(storage, step_dir)


@pytest.mark.parametrize("algorithm", ["crc32", "crc32c"])
def test_manifest_round_trip(algorithm):
    manifest = Manifest(layout.StepDir(3, NEW), 2, {".metadata": FileDigest(1, 2, algorithm)},
                        12.5)
    assert Manifest.parse(manifest.to_bytes(), layout.StepDir(3, NEW), path="p") == manifest


def _manifest(format_: str, entry: dict) -> bytes:
    return json.dumps({"format": format_, "step": 3, "session": NEW, "world_size": 1,
                       "committed_at": 1.0, "files": {".metadata": entry}}).encode()


def test_a_manifest_of_the_first_format_still_reads():
    raw = _manifest("ray_resilience.checkpoint/1", {"size": 2, "crc32": zlib.crc32(b"md")})
    got = Manifest.parse(raw, layout.StepDir(3, NEW), path="p")
    assert got.files[".metadata"] == FileDigest(2, zlib.crc32(b"md"), "crc32")


@pytest.mark.parametrize("format_, entry, says", [
    ("ray_resilience.checkpoint/9", {"size": 2, "crc32": 1}, "written by a newer"),
    ("ray_resilience.checkpoint/2", {"size": 2, "sha7": 1}, "no checksum this version"),
])
def test_a_manifest_this_version_cannot_verify_is_refused_saying_why(format_, entry, says):
    with pytest.raises(CheckpointCorruptError, match=says):
        Manifest.parse(_manifest(format_, entry), layout.StepDir(3, NEW), path="p")


def test_new_commits_name_their_checksum(storage):
    step_dir = _fake_step(storage, 10, NEW, commit=True)
    with open(storage.path(f"{step_dir.name}/manifest.json")) as f:
        raw = json.load(f)
    assert raw["format"] == layout.FORMAT_VERSION
    assert set(raw["files"][".metadata"]) == {"size", checksum.CHECKSUM}
    assert read_manifest(storage, step_dir).files[".metadata"].checksum == checksum.CHECKSUM


def test_retrying_retries_transient_errors_only():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise StorageUnavailableError("s3://b/k", "write", "connection refused")
        return "ok"
    assert retrying(flaky, what="t", num_retries=3, backoff_s=0.01) == "ok" and len(calls) == 3

    def denied():
        calls.append(1)
        raise StoragePermissionError("/x", "write", "EACCES")
    calls.clear()
    with pytest.raises(StoragePermissionError):
        retrying(denied, what="t", num_retries=5, backoff_s=0.01)
    assert len(calls) == 1


def test_disk_full_names_the_path_and_keeps_the_committed_step():
    with tmpfs("256k") as root:
        storage = CheckpointStorage.for_run(root, "run")
        committed = _fake_step(storage, 10, NEW, commit=True)
        step_dir = layout.StepDir(20, NEW)
        storage.make_dir(step_dir.name)
        with pytest.raises(StorageFullError) as info, \
                storage.open_output(f"{step_dir.name}/__0_0.distcp") as out:
            out.write(b"x" * (1 << 20))
        assert storage.path(f"{step_dir.name}/__0_0.distcp") in str(info.value)
        assert "num_to_keep" in str(info.value) and not info.value.retryable
        assert committed_steps(storage) == [committed]
        assert read_manifest(storage, committed).files["__0_0.distcp"].size == 40


def test_read_only_storage_is_a_permission_error_naming_the_path():
    with tmpfs("1m", read_only=True) as root:
        storage = CheckpointStorage.for_run(root, "run")
        with pytest.raises(StoragePermissionError) as info:
            storage.check_writable()
        assert root in str(info.value) and "permissions" in str(info.value)


def test_commit_queue_commits_steps_in_the_order_they_became_complete():
    """The CI race: step 2 completes first but its thread is slow to commit; the thread that
    completed step 4 drains first and must commit 2, then 4 (step 2 used to be skipped)."""
    queue, order = CommitQueue(), []
    assert not queue.arrive(NEW, 2, 0, 2, b"r0s2")
    assert queue.arrive(NEW, 2, 1, 2, b"r1s2")  # complete: its thread has not drained yet
    assert not queue.arrive(NEW, 4, 1, 2, b"r1s4")
    assert queue.pending() == {f"{NEW}:2": "queued", f"{NEW}:4": [1]}
    assert queue.arrive(NEW, 4, 0, 2, b"r0s4")
    queue.drain(lambda key, shards: order.append((key, shards)))
    assert order == [((NEW, 2), {0: b"r0s2", 1: b"r1s2"}), ((NEW, 4), {1: b"r1s4", 0: b"r0s4"})]
    queue.drain(lambda key, shards: order.append(key))  # the late thread of step 2: nothing left
    assert len(order) == 2 and queue.pending() == {}


def test_commit_queue_steps_completed_during_a_commit_follow_it():
    queue, order = CommitQueue(), []
    entered, release = threading.Event(), threading.Event()

    def slow_commit(key, shards):
        order.append(key[1])
        if key[1] == 2:
            entered.set()
            assert release.wait(10)

    queue.arrive(NEW, 2, 0, 1, b"a")
    first = threading.Thread(target=queue.drain, args=(slow_commit,))
    first.start()
    assert entered.wait(10)
    assert queue.pending() == {f"{NEW}:2": "committing"}
    assert queue.arrive(NEW, 4, 0, 1, b"b") and queue.arrive(NEW, 6, 0, 1, b"c")
    second = threading.Thread(target=queue.drain, args=(slow_commit,))
    second.start()  # waits for the commit lock
    release.set()
    first.join(10)
    second.join(10)
    assert order == [2, 4, 6]


def test_commit_queue_new_session_drops_older_reports_not_yet_committing():
    queue = CommitQueue()
    queue.arrive(OLD, 3, 0, 2, b"x")
    queue.arrive(OLD, 5, 0, 1, b"y")  # complete, queued
    queue.arrive(NEW, 3, 1, 2, b"z")
    queue.keep_only(NEW)
    assert queue.pending() == {f"{NEW}:3": [1]}
    committed = []
    queue.drain(lambda key, shards: committed.append(key))
    assert committed == []
