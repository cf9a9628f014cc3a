"""The run folder on local/FSx paths or S3 through pyarrow.fs, and what a finished run leaves
there: results.json, goodput.txt, timeline.png."""

from __future__ import annotations

import json
import logging
import os
import posixpath
import tempfile
import urllib.parse
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

# Re-exported: trainer.py resolves the run folder through this module.
from ray_resilience._internal.checkpoint.format.storage import resolve as resolve
from ray_resilience.errors import ConfigError

log = logging.getLogger(__name__)


SECRET_QUERY_KEYS = frozenset({"access_key", "secret_key", "session_token"})
"""pyarrow's S3 URI options that carry credentials: never written into results."""


def run_dir_uri(storage_path: str, name: str) -> str:
    """The run folder as the user would write it, without credentials (for messages,
    `Result.path` and results.json)."""
    if "://" in storage_path:
        base, _, query = storage_path.partition("?")
        kept = [(k, v) for k, v in urllib.parse.parse_qsl(query, keep_blank_values=True)
                if k.lower() not in SECRET_QUERY_KEYS]
        query = urllib.parse.urlencode(kept, safe=":/")
        return base.rstrip("/") + "/" + name + (f"?{query}" if query else "")
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



def read_text(run_dir: str, name: str) -> str:
    """A file of a run folder given as a path or URI (s3://bucket/prefix/run?endpoint_override=..);
    FileNotFoundError naming it when it is not there."""
    base, _, query = run_dir.partition("?")
    fs, path = resolve(base.rstrip("/") + "/" + name + (f"?{query}" if query else ""))
    try:
        with fs.open_input_stream(path) as src:
            return src.read().decode()
    except FileNotFoundError:
        raise FileNotFoundError(f"{name} not found in {run_dir}") from None
    except OSError as exc:
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"{name} not found in {run_dir}") from None
        raise exc


def write_run_artifacts(fs: pafs.FileSystem, run_path: str, result: Any) -> None:
    """results.json always; with a goodput report also its table and the timeline picture."""
    payload = result.summary()
    report = result.goodput
    if report is not None:
        payload["goodput"] = report.to_dict(include_timeline=True)
    if isinstance(result.checkpoint, dict):
        payload["checkpoint"] = {k: v for k, v in result.checkpoint.items() if k != "phases"}
    write_json(fs, posixpath.join(run_path, "results.json"), payload)
    if report is None:
        return
    with fs.open_output_stream(posixpath.join(run_path, "goodput.txt")) as out:
        out.write(report.table().encode())
    try:
        from ray_resilience.goodput.plot import plot_timeline  # noqa: PLC0415 - matplotlib, only to draw

        with tempfile.TemporaryDirectory() as tmp:
            png = os.path.join(tmp, "timeline.png")
            plot_timeline(report, png)
            with open(png, "rb") as src, fs.open_output_stream(
                    posixpath.join(run_path, "timeline.png")) as out:
                out.write(src.read())
    except Exception:
        log.warning("could not plot the run timeline into %s", run_path, exc_info=True)
