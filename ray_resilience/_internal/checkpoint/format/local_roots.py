"""Node-local run folders of the local tier: naming, the writers' locks, and removal of
folders whose run was killed (nobody holds their `flock`).
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import time

import ray

from ray_resilience._internal.constants import (
    DEFAULT_STALE_LOCAL_FOLDER_S,
    STALE_LOCAL_FOLDER_ENV_VAR,
    env_float,
)

logger = logging.getLogger(__name__)

LOCK_NAME = ".lock"
SUBDIR = "ray_resilience"


def run_root(local_dir: str, run_name: str, token: str) -> str:
    """The run's folder prefix under `local_dir` (one per `fit()`); see `node_root`."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run_name)[:80] or "run"
    return os.path.join(local_dir, SUBDIR, f"{safe}-{token}")


def node_root(prefix: str, node_id: str | None = None) -> str:
    """The run's folder for one Ray node (this one by default): named after the node, so a rank
    that moved never reads the files of the node it left."""
    if node_id is None:
        node_id = ray.get_runtime_context().get_node_id()
    return f"{prefix}-{node_id[:16]}"


class RootLock:
    """A writer's shared lock on its run's local folder; removes other runs' stale folders."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._fd: int | None = None
        try:
            os.makedirs(root, exist_ok=True)
            self._fd = os.open(os.path.join(root, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_SH)
        except OSError as exc:
            logger.warning("local snapshot folder %s is not usable (%s); ranks on this node will "
                           "turn the local tier off", root, exc)
        remove_stale_roots(os.path.dirname(root), keep=root)

    def remove(self) -> None:
        """The run is over: removes the folder (other writers of the node may race: harmless)."""
        shutil.rmtree(self.root, ignore_errors=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def remove_stale_roots(parent: str, *, keep: str | None = None) -> list[str]:
    """Removes run folders under `parent` that no live writer holds; returns them."""
    removed = []
    stale_s = env_float(STALE_LOCAL_FOLDER_ENV_VAR, DEFAULT_STALE_LOCAL_FOLDER_S)
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        path = os.path.join(parent, name)
        if path == keep or not os.path.isdir(path):
            continue
        lock = os.path.join(path, LOCK_NAME)
        try:
            fd = os.open(lock, os.O_RDWR)
        except FileNotFoundError:
            try:
                if time.time() - os.stat(path).st_mtime > stale_s:
                    shutil.rmtree(path, ignore_errors=True)
                    removed.append(path)
            except OSError:
                pass
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a writer of that run is alive
        finally:
            os.close(fd)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
        logger.info("removed stale local snapshot folder %s (no live writer holds it)", path)
    return removed
