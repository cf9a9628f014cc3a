"""Shared `results.json` in a run folder: each writer owns one top-level key.

Several parts of a run write into the same file (the goodput report, the trainer's Result, the
benchmark). Each one reads the file, replaces only its own key and writes it back atomically
(temporary file in the same folder, then `os.replace`), under an advisory `flock` so two writers
in different processes on one machine do not lose each other's keys. Local paths only.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from typing import Any

RESULTS_FILENAME = "results.json"


def merge_results_key(run_dir: str, key: str, value: Any) -> str:
    """Set `results.json[key] = value` in `run_dir`, keeping every other key. Returns the path.

    A file that exists but is not a JSON object is an error (it is not ours to overwrite).
    """
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, RESULTS_FILENAME)
    with _locked(path + ".lock"):
        current: dict[str, Any] = {}
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                current = json.load(f)
            if not isinstance(current, dict):
                raise ValueError(
                    f"{path} holds a {type(current).__name__}, not a JSON object; move it away "
                    "so the run can write its results there."
                )
        current[key] = value
        write_text_atomic(path, json.dumps(current, indent=2, sort_keys=True, allow_nan=False))
    return path


def write_text_atomic(path: str, text: str) -> None:
    """Write `text` to `path` so readers see the old or the new file, never a partial one."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text if text.endswith("\n") else text + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _locked(lock_path: str) -> Iterator[None]:
    with open(lock_path, "a", encoding="utf-8") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
