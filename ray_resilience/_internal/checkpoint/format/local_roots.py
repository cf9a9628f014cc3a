"""Node-local run folders of the local tier: naming, their private parent, the `flock`s that mark
a folder live, and removal of folders whose run is gone.

Only what is certainly ours is ever removed: names of our pattern, owned by this uid, reached
without following a symlink (`O_NOFOLLOW`, `dir_fd`-relative), removed while holding their lock
exclusively; `local_dir` must be a tmpfs. Writers and ranks hold the lock shared while they use
a folder, so a run whose writers died keeps its folder as long as one rank lives.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import stat
import time

import ray

from ray_resilience._internal.constants import (
    DEFAULT_STALE_LOCAL_FOLDER_S,
    STALE_LOCAL_FOLDER_ENV_VAR,
    env_float,
)
from ray_resilience.errors import ConfigError

logger = logging.getLogger(__name__)

LOCK_NAME = ".lock"
SUBDIR = "ray_resilience"
_RUN_FOLDER = re.compile(r"[A-Za-z0-9_.-]{1,80}-[0-9a-f]{12}-[0-9a-f]{16}")
"""`<run name>-<token>-<node id>`: the only names cleanup considers."""
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_LOCK_TRIES = 5


def run_root(local_dir: str, run_name: str, token: str) -> str:
    """The run's folder prefix under `local_dir` (one per `fit()`, `token` 12 hex digits); see
    `node_root`."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run_name)[:80] or "run"
    return os.path.join(local_dir, SUBDIR, f"{safe}-{token}")


def node_root(prefix: str, node_id: str | None = None) -> str:
    """The run's folder for one Ray node (this one by default): named after the node, so a rank
    that moved never reads the files of the node it left."""
    if node_id is None:
        node_id = ray.get_runtime_context().get_node_id()
    return f"{prefix}-{node_id[:16]}"


def check_local_dir(local_dir: str) -> None:
    """ConfigError unless `local_dir` is a folder on a tmpfs: the tier's files belong in
    node-local memory, and a misconfigured folder (a checkout, a home) must never host them."""
    if not os.path.isdir(local_dir):
        raise ConfigError("CheckpointConfig.local_dir", local_dir,
                          "is not an existing folder; create it on node-local shared memory "
                          "(e.g. '/dev/shm', on Kubernetes an emptyDir with medium: Memory), or "
                          "turn the local tier off with local_interval_steps=0.")
    fstype = filesystem_type(local_dir)
    if fstype != "tmpfs":
        found = f"is on {fstype}" if fstype else "is not a folder of a mounted file system"
        raise ConfigError("CheckpointConfig.local_dir", local_dir,
                          f"{found}, not a tmpfs; use node-local shared memory such as "
                          "'/dev/shm' (on Kubernetes an emptyDir with medium: Memory), or turn "
                          "the local tier off with local_interval_steps=0.")


def filesystem_type(path: str) -> str | None:
    """The type of the file system holding `path` (the longest mount point above it)."""
    real, best, found = os.path.realpath(path), -1, None
    try:
        with open("/proc/mounts") as f:
            mounts = [line.split()[1:3] for line in f if len(line.split()) >= 3]
    except OSError:
        return None
    for mount, fstype in mounts:
        mount = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), mount)
        inside = real == mount or real.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) > best:
            best, found = len(mount), fstype
    return found


def _private(fd: int, path: str, *, only_runs: bool = False) -> None:
    """Raises unless the folder behind `fd` is ours; a mode open to others is tightened, for a
    parent (`only_runs`) only if it holds nothing but run folders (else it is not ours)."""
    info = os.fstat(fd)
    if info.st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to uid {info.st_uid}, not to this process's uid "
                              f"{os.getuid()}: refusing to use it for local snapshots")
    if not info.st_mode & 0o077:
        return
    if only_runs:
        foreign = [n for n in os.listdir(fd) if not _RUN_FOLDER.fullmatch(n)][:3]
        if foreign:
            raise PermissionError(f"{path} is open to other users and holds {foreign}, which "
                                  "are not local snapshot folders: refusing to use it")
    os.fchmod(fd, 0o700)


def open_parent(parent: str) -> int:
    """A descriptor of the private parent `<local_dir>/ray_resilience`, created 0700; OSError for
    a symlink or a folder of another user."""
    try:
        os.mkdir(parent, 0o700)
    except FileExistsError:
        pass
    fd = os.open(parent, _DIR_FLAGS)
    try:
        _private(fd, parent, only_runs=True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def hold(root: str) -> int:
    """Creates the run folder `root` (0700, under its private parent) and returns a descriptor
    holding its `.lock` shared: while one is held, no cleanup removes the folder."""
    for _ in range(_LOCK_TRIES):
        parent = open_parent(os.path.dirname(root))
        try:
            name = os.path.basename(root)
            try:
                os.mkdir(name, 0o700, dir_fd=parent)
            except FileExistsError:
                pass
            folder = os.open(name, _DIR_FLAGS, dir_fd=parent)
        finally:
            os.close(parent)
        try:
            _private(folder, root)
            fd = os.open(LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600, dir_fd=folder)
        finally:
            os.close(folder)
        fcntl.flock(fd, fcntl.LOCK_SH)
        if _still_linked(fd, os.path.join(root, LOCK_NAME)):
            return fd
        os.close(fd)  # a cleanup removed the folder between our open and our lock: again
    raise OSError(f"could not lock {root} ({_LOCK_TRIES} tries lost to a concurrent cleanup)")


def _still_linked(fd: int, path: str) -> bool:
    try:
        now = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


class RootLock:
    """A writer's shared lock on its run's local folder; removes other runs' stale folders."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._fd: int | None = None
        try:
            self._fd = hold(root)
        except OSError as exc:
            logger.warning("local snapshot folder %s is not usable (%s); ranks on this node will "
                           "turn the local tier off", root, exc)
            return
        remove_stale_roots(os.path.dirname(root), keep=root)

    def remove(self) -> None:
        """The run is over: removes its folder (other writers of the node may race: harmless)."""
        try:
            parent = os.open(os.path.dirname(self.root), _DIR_FLAGS)
        except OSError:
            parent = None
        if parent is not None:
            try:
                shutil.rmtree(os.path.basename(self.root), ignore_errors=True, dir_fd=parent)
            finally:
                os.close(parent)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def remove_stale_roots(parent: str, *, keep: str | None = None) -> list[str]:
    """Removes run folders under `parent` that nobody holds (or, without a lock file, older than
    the stale age); returns them. Anything not certainly ours is left alone."""
    removed: list[str] = []
    try:
        fd = open_parent(parent) if os.path.lexists(parent) else None
    except OSError as exc:
        logger.warning("not cleaning up %s: %s", parent, exc)
        return removed
    if fd is None:
        return removed
    stale_s = env_float(STALE_LOCAL_FOLDER_ENV_VAR, DEFAULT_STALE_LOCAL_FOLDER_S)
    try:
        for name in os.listdir(fd):
            if (keep is None or name != os.path.basename(keep)) and _RUN_FOLDER.fullmatch(name) \
                    and _remove_if_dead(fd, name, stale_s):
                removed.append(os.path.join(parent, name))
                logger.info("removed stale local snapshot folder %s (no live writer or rank "
                            "holds it)", removed[-1])
    finally:
        os.close(fd)
    return removed


def _remove_if_dead(parent: int, name: str, stale_s: float) -> bool:
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return False
        folder = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError:
        return False
    try:
        if os.fstat(folder).st_ino != info.st_ino:
            return False  # replaced since the stat
        lock = _open_lock_of_dead(folder, info, stale_s)
        if lock is None:
            return False
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(lock)
            return False  # a writer or rank of that run is alive
        try:  # removed while we hold the lock; rmtree with dir_fd never follows a symlink
            shutil.rmtree(name, dir_fd=parent)
        except OSError as exc:
            logger.warning("could not remove stale local snapshot folder %s: %s", name, exc)
            return False
        finally:
            os.close(lock)
        return True
    finally:
        os.close(folder)


def _open_lock_of_dead(folder: int, info: os.stat_result, stale_s: float) -> int | None:
    """The folder's lock file to try, creating one for an old folder without (its writer never
    started); None when a young folder has none."""
    try:
        return os.open(LOCK_NAME, os.O_RDWR | os.O_NOFOLLOW, dir_fd=folder)
    except FileNotFoundError:
        if time.time() - info.st_mtime <= stale_s:
            return None
    except OSError:
        return None
    try:
        return os.open(LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600,
                       dir_fd=folder)
    except OSError:
        return None
