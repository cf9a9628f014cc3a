"""Result files: one JSON document per benchmark part, timelines gzipped beside it."""

from __future__ import annotations

import gzip
import json
import os
from typing import Any


def write_json(path: str, document: dict[str, Any]) -> str:
    """Atomically, sorted keys and stable float formatting, so a rerun diffs cleanly."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(f"{path}.tmp", "w", encoding="utf-8") as f:
        json.dump(document, f, indent=1, sort_keys=True, default=_plain)
        f.write("\n")
    os.replace(f"{path}.tmp", path)
    return path


def write_gz(path: str, document: dict[str, Any]) -> str:
    """Compact gzipped JSON (timelines: enough to re-score every run)."""
    with gzip.open(f"{path}.tmp", "wt", encoding="utf-8", compresslevel=9) as f:
        json.dump(document, f, separators=(",", ":"), sort_keys=True, default=_plain)
    os.replace(f"{path}.tmp", path)
    return path


def read_json(path: str) -> dict[str, Any]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def _plain(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)
