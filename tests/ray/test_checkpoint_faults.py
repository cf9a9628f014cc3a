"""Faults and bad input on local storage, end to end: disk full and read-only storage mid-run,
unwritable storage at start, unsafe extra state, a tampered `.metadata` pickle."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import zlib

import pytest
import ray

from ray_resilience._internal.checkpoint.format.commit import read_manifest
from ray_resilience._internal.checkpoint.format.shard_io import read_verified
from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage
from ray_resilience.checkpoint import StoragePermissionError
from tests.support.checkpoint_harness import on_all, start_with, stop_ranks
from tests.support.checkpoint_service import start_service, step_folder, wait_committed
from tests.support.tmpfs import tmpfs

pytestmark = pytest.mark.timeout(300)


def assert_intact(root: str, step: int) -> None:
    """Every file of the committed step still matches its manifest."""
    storage = CheckpointStorage.for_run(root, "run")
    (step_dir,) = [d for d in storage.list_step_dirs() if d.step == step]
    manifest = read_manifest(storage, step_dir)
    for name, digest in manifest.files.items():
        read_verified(storage, step_dir.name, name, digest)


def _fill(root: str) -> str:
    """Fills the file system, leaving a few KB (less than one shard)."""
    path = os.path.join(root, "filler")
    stat = os.statvfs(root)
    with open(path, "wb") as f:
        f.write(b"\0" * max(stat.f_bavail * stat.f_frsize - 16 * 1024, 0))
    return path


@pytest.mark.parametrize("fault", [
    pytest.param("disk_full", marks=pytest.mark.slow),  # ~13 s; read_only takes the same path
    "read_only"])
def test_storage_fault_mid_run_names_the_path_and_keeps_the_last_commit(ray_session, fault):
    with tmpfs("8m") as root:
        service, ranks = start_with(lambda: start_service(root, 2, memory_tier=False))
        try:
            on_all(ranks, "save", 1)
            assert all(on_all(ranks, "wait_idle"))
            wait_committed(service, 1)
            filler = _fill(root) if fault == "disk_full" else None
            if fault == "read_only":
                subprocess.run(["mount", "-o", "remount,ro", root], check=True)
            assert all(b is not None for b in on_all(ranks, "save", 2))  # training is not stopped
            assert all(on_all(ranks, "wait_idle"))
            errors = [s["last_error"] for s in on_all(ranks, "stats")]
            words = "StorageFullError" if fault == "disk_full" else "StoragePermissionError"
            assert all(words in e and root in e for e in errors), errors
            assert service.latest_committed_step() == 1
            assert_intact(root, 1)
            if fault == "read_only":
                subprocess.run(["mount", "-o", "remount,rw", root], check=True)
            else:
                os.remove(filler)
            on_all(ranks, "save", 3)  # storage is back: saving resumes
            assert all(on_all(ranks, "wait_idle"))
            wait_committed(service, 3)
            assert [r["step"] for r in on_all(ranks, "load")] == [3, 3]
        finally:
            stop_ranks(ranks)
            service.shutdown()


def test_unwritable_storage_fails_at_start_naming_the_path(ray_session):
    with tmpfs("1m", read_only=True) as root:
        with pytest.raises(StoragePermissionError) as info:
            start_service(root, 1)
        assert os.path.join(root, "run", "checkpoints") in str(info.value)


def test_unsafe_extra_raises_type_error_naming_the_key(ray_session, tmp_path):
    service = start_service(str(tmp_path), 1)

    class Bad:
        pass

    def save_bad(spec):
        from ray_resilience._internal.checkpoint.rank.rank_checkpointer import RankCheckpointer  # noqa: PLC0415 - runs on the rank
        from ray_resilience.examples.llama import build_model  # noqa: PLC0415 - runs on the rank

        ckpt = RankCheckpointer(spec, rank=0, world_size=1)
        try:
            ckpt.save(1, model=build_model("tiny"), extra={"data": {"position": Bad()}})
        except TypeError as exc:
            return str(exc)
        finally:
            ckpt.close()
        return "no error"
    try:
        message = ray.get(ray.remote(save_bad).remote(service.rank_spec(0)), timeout=120)
        assert "extra['data.position']" in message and "JSON-safe" in message
    finally:
        service.shutdown()


class _Exploit:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_tampered_metadata_pickle_is_never_executed(ray_session, tmp_path):
    marker = str(tmp_path / "exploit-ran")  # this test's own: concurrent runs share /tmp
    service, ranks = start_with(lambda: start_service(str(tmp_path), 2, memory_tier=False))
    try:
        for step in (1, 2):
            on_all(ranks, "save", step)
            assert all(on_all(ranks, "wait_idle"))
            wait_committed(service, step)
        folder = step_folder(str(tmp_path), "run", 2)
        evil = pickle.dumps(_Exploit(marker))
        with open(os.path.join(folder, ".metadata"), "wb") as f:
            f.write(evil)
        manifest_path = os.path.join(folder, "manifest.json")
        with open(manifest_path) as f:
            manifest = json.load(f)
        manifest["files"][".metadata"] = {"size": len(evil), "crc32": zlib.crc32(evil)}
        with open(manifest_path, "w") as f:
            json.dump(manifest, f)  # checksums pass: only the unpickler stands in the way
        loaded = on_all(ranks, "load")
        assert [r["step"] for r in loaded] == [1, 1]
        assert all("not a DCP metadata type" in r["fallbacks"][0] for r in loaded)
        assert not os.path.exists(marker)
    finally:
        stop_ranks(ranks)
        service.shutdown()
