"""A real, small tmpfs for storage-error tests (needs mount rights)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile

import pytest


@contextlib.contextmanager
def tmpfs(size: str, *, read_only: bool = False):
    """A real small file system (needs mount rights; skipped otherwise)."""
    path = tempfile.mkdtemp(prefix="rr-tmpfs-")
    options = f"size={size}" + (",ro" if read_only else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", path],
                          capture_output=True)
    if done.returncode != 0:
        os.rmdir(path)
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], check=False)
        os.rmdir(path)
