"""Cleanup of node-local run folders removes only what is certainly a dead run of ours: the
review's demonstrations (a misconfigured `local_dir`, a symlinked parent, another run's live
folder) on scratch copies, with nothing foreign deleted; and `local_dir` must be a tmpfs."""

from __future__ import annotations

import os
import time

import pytest
import torch

from ray_resilience._internal.checkpoint.format import local_roots
from ray_resilience._internal.checkpoint.format.local_roots import (
    LOCK_NAME,
    SUBDIR,
    RootLock,
    remove_stale_roots,
)
from ray_resilience._internal.checkpoint.rank.local.tier import LocalSnapshots
from ray_resilience.errors import ConfigError
from tests.support.local_snapshots import _save

pytestmark = pytest.mark.timeout(60)
NODE = "0123456789abcdef"


def _run_folder(local_dir, name: str, token: str = "a1b2c3d4e5f6") -> str:
    return os.path.join(str(local_dir), SUBDIR, f"{name}-{token}-{NODE}")


def _aged(path, hours: float = 1.0) -> None:
    past = time.time() - hours * 3600
    os.utime(path, (past, past))


def _tree(root) -> set[str]:
    return {os.path.relpath(os.path.join(d, n), root)
            for d, dirs, files in os.walk(root) for n in dirs + files}


def test_a_misconfigured_local_dir_loses_nothing(tmp_path):
    """local_dir set to a checkout whose package folder is named like ours."""
    checkout = tmp_path / "checkout"
    package = checkout / SUBDIR
    for sub in ("_internal", "checkpoint", ".git"):
        (package / sub).mkdir(parents=True)
        (package / sub / "module.py").write_text("code")
        _aged(package / sub)
    os.chmod(package, 0o755)
    before = _tree(checkout)
    lock = RootLock(_run_folder(checkout, "run"))  # a writer starting there
    lock.remove()
    assert remove_stale_roots(str(package)) == []
    assert _tree(checkout) == before
    with pytest.raises(ConfigError, match="CheckpointConfig.local_dir") as info:
        local_roots.check_local_dir(str(checkout))
    assert "tmpfs" in str(info.value) and str(checkout) in str(info.value)


def test_a_symlinked_parent_is_never_followed(tmp_path):
    """Another account planted `<local_dir>/ray_resilience` -> its victim's folder."""
    victim = tmp_path / "victim_home"
    for name in ("projects", "data"):
        folder = victim / f"{name}-a1b2c3d4e5f6-{NODE}"  # even named like a run folder
        folder.mkdir(parents=True)
        (folder / "file").write_text("precious")
        _aged(folder)
    local_dir = tmp_path / "shm"
    local_dir.mkdir()
    (local_dir / SUBDIR).symlink_to(victim)
    before = _tree(victim)
    RootLock(_run_folder(local_dir, "run"))
    assert remove_stale_roots(str(local_dir / SUBDIR)) == []
    assert _tree(victim) == before


def test_another_runs_folder_stays_while_one_of_its_ranks_lives(tmp_path):
    """Run A's writers died (their lock file stays, unheld); its rank still writes there."""
    a_root = _run_folder(tmp_path, "run-a")
    writer_a = RootLock(a_root)
    os.close(writer_a._fd)  # the writer process is gone: its lock with it
    rank = LocalSnapshots(a_root, 0)
    assert _save(rank, 1, "s", torch.nn.Linear(4, 4), None)
    RootLock(_run_folder(tmp_path, "run-b", "0f0f0f0f0f0f"))  # run B's writer starts here
    assert os.path.isfile(os.path.join(a_root, "rank0.0"))
    rank.close()  # A's last process is gone: A is dead, its folder goes
    assert remove_stale_roots(str(tmp_path / SUBDIR)) == [a_root]


def test_only_our_uids_run_folders_are_removed(tmp_path):
    if os.getuid() != 0:
        pytest.skip("needs root to create another user's folder")
    parent = tmp_path / SUBDIR
    theirs, mine = _run_folder(tmp_path, "theirs"), _run_folder(tmp_path, "mine")
    for folder in (theirs, mine):
        os.makedirs(folder)
        open(os.path.join(folder, LOCK_NAME), "w").close()
    os.chown(theirs, 12345, 12345)
    os.chmod(parent, 0o700)
    assert remove_stale_roots(str(parent)) == [mine]
    assert os.path.isdir(theirs)


def test_local_dir_must_be_a_tmpfs(tmp_path):
    with pytest.raises(ConfigError, match="CheckpointConfig.local_dir.*not an existing folder"):
        local_roots.check_local_dir(str(tmp_path / "missing"))
    if local_roots.filesystem_type("/dev/shm") != "tmpfs":
        pytest.skip("/dev/shm is not a tmpfs here")
    local_roots.check_local_dir("/dev/shm")
