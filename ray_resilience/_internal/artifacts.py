"""What a finished run leaves in its folder: results.json, goodput.txt, timeline.png.

Written through pyarrow.fs, so the same code serves local/FSx paths and S3.
"""

from __future__ import annotations

import logging
import os
import posixpath
import tempfile
from typing import Any

import pyarrow.fs as pafs

from ray_resilience._internal import storage

log = logging.getLogger(__name__)


def write_run_artifacts(fs: pafs.FileSystem, run_path: str, result: Any) -> None:
    """results.json always; with a goodput report also its table and the timeline picture."""
    payload = result.summary()
    report = result.goodput
    if report is not None:
        payload["goodput"] = report.to_dict(include_timeline=True)
    if isinstance(result.checkpoint, dict):
        payload["checkpoint"] = {k: v for k, v in result.checkpoint.items() if k != "phases"}
    storage.write_json(fs, posixpath.join(run_path, "results.json"), payload)
    if report is None:
        return
    with fs.open_output_stream(posixpath.join(run_path, "goodput.txt")) as out:
        out.write(report.table().encode())
    try:
        from ray_resilience._internal.timeline_plot import plot_timeline

        with tempfile.TemporaryDirectory() as tmp:
            png = os.path.join(tmp, "timeline.png")
            plot_timeline(report, png)
            with open(png, "rb") as src, fs.open_output_stream(
                    posixpath.join(run_path, "timeline.png")) as out:
                out.write(src.read())
    except Exception:  # noqa: BLE001 - a picture must never fail a finished run
        log.warning("could not plot the run timeline into %s", run_path, exc_info=True)
