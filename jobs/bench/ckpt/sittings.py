"""Which invocation measured each size of `checkpoint.json`, and how a rerun of some sizes
merges into the results already there (no Ray, torch or peer import: the renderer's tests use
it without the benchmark's extras)."""

from __future__ import annotations

import os

from sweep.results import read_json

SITTING = ("command", "date_utc", "duration_s", "reps", "quick")
"""What each size records (under "sittings") of the invocation that measured it."""


def sitting(document: dict) -> dict:
    return {key: document[key] for key in SITTING if key in document}


def merged(path: str, document: dict) -> dict:
    """`document` over the results already at `path`: its sizes' rows replace theirs, the other
    sizes' rows stay, each size with the sitting that measured it (a size can be rerun alone:
    the ~1 GB rows take most of an hour). The top level is the newest sitting's."""
    if not os.path.exists(path):
        return document
    old = read_json(path)
    new_sizes = set(document["sittings"])
    kept = [row for row in old.get("rows", []) if row["size"] not in new_sizes]
    sittings = {size: old.get("sittings", {}).get(size, sitting(old))
                for size in dict.fromkeys(row["size"] for row in kept)}
    sittings.update(document["sittings"])
    failures = [f for f in old.get("failures", []) if f["size"] not in new_sizes]
    return {**document, "rows": kept + document["rows"], "sittings": sittings,
            "failures": failures + document.get("failures", [])}
