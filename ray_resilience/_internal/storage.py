"""The run folder on local/FSx paths or S3, through pyarrow.fs (as Ray Train's storage_path)."""

from __future__ import annotations

import json
import posixpath
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from ray_resilience.errors import ConfigError


def resolve(storage_path: str, filesystem: pafs.FileSystem | None = None) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for a local path, a file:// or an s3:// URI."""
    if filesystem is not None:
        return filesystem, storage_path
    if "://" not in storage_path:
        import os

        return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(storage_path))
    try:
        return pafs.FileSystem.from_uri(storage_path)
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise ConfigError("RunConfig.storage_path", storage_path,
                          f"pyarrow cannot open it ({exc}); use a local path or "
                          "s3://bucket/prefix[?endpoint_override=host:port&scheme=http].") from exc


def run_dir_uri(storage_path: str, name: str) -> str:
    """The run folder as the user would write it (for messages and `Result.path`)."""
    if "://" in storage_path:
        base, _, query = storage_path.partition("?")
        return base.rstrip("/") + "/" + name + (f"?{query}" if query else "")
    import os

    return os.path.join(os.path.abspath(os.path.expanduser(storage_path)), name)


def check_writable(fs: pafs.FileSystem, path: str, *, field: str, value: str) -> None:
    """Creates the folder and writes/deletes a probe object; raises ConfigError naming the path."""
    probe = posixpath.join(path, f".write-probe-{uuid.uuid4().hex}")
    try:
        fs.create_dir(path, recursive=True)
        with fs.open_output_stream(probe) as out:
            out.write(b"ok")
        fs.delete_file(probe)
    except (pa.ArrowException, OSError, ValueError) as exc:  # any storage error: not writable
        raise ConfigError(field, value, f"cannot write to {path!r} ({type(exc).__name__}: {exc}); "
                          "give a writable directory or bucket, or fix its permissions.") from exc


def write_json(fs: pafs.FileSystem, path: str, payload: Any) -> None:
    """Writes JSON so readers see the old or the new file, never a torn one."""
    data = json.dumps(payload, indent=2, sort_keys=True, default=str).encode()
    if isinstance(fs, pafs.LocalFileSystem):
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        with fs.open_output_stream(tmp) as out:
            out.write(data)
        fs.move(tmp, path)
    else:  # one PUT is atomic on S3
        with fs.open_output_stream(path) as out:
            out.write(data)

