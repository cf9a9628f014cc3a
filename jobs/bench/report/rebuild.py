"""The in-process rebuild section of docs/benchmarks.md (from `rebuild/rebuild-<size>.json`,
`overhead/rebuild_probe.py`)."""

from __future__ import annotations

import statistics

from .fmt import ms, num, table

LABELS = {
    "default": "glibc as it comes",
    "trim": "glibc as it comes, `malloc_trim(0)` after the free (ours' teardown)",
    "keep": "glibc keeps freed memory: {env}",
}


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _rows(doc: dict) -> list[list[str]]:
    rows = []
    variants = dict.fromkeys(run["variant"] for run in doc["runs"])
    for variant in variants:
        runs = [r for r in doc["runs"] if r["variant"] == variant]
        s = [r["summary"] for r in runs]
        env = " ".join(f"{k}={v}" for k, v in runs[0]["env"].items())
        steady = _median([x["steady_step_s"] for x in s])
        first = _median([x["after_rebuild_first_step_s"] for x in s])
        rows.append([
            doc["size"], variant, str(len(runs)), ms(steady), ms(first),
            ms(_median([x["after_rebuild_later_step_s"] for x in s])),
            ms(first - steady) if first is not None and steady is not None else "–",
            num(_median([x["steady_step_faults"] for x in s])),
            num(_median([x["after_rebuild_first_step_faults"] for x in s])),
            LABELS.get(variant, variant).format(env=env)])
    return rows


def section(docs: list[dict]) -> str:
    if not docs:
        return ""
    produced = "; ".join(f"{d['size']}: `{d['command']}` on {d['started']}" for d in docs)
    return "\n".join([
        "### In-process rebuild and glibc's allocator", "",
        "What an in-process restart's rebuild costs the steps after it, without Ray or this "
        "library (`jobs/bench/overhead/rebuild_probe.py`): 2 gloo processes train the "
        "benchmark's FSDP2 LLaMA on a thread of their own, then free the model and optimizer, "
        "build them again and copy the saved state in, twice; the variants alternate, each in "
        "fresh processes. Medians over the repetitions (each repetition's median step): steady "
        "= the first build's steps from the third on; after a rebuild = the first step after "
        "each rebuild, and the steps after it. Faults: the training thread's minor page faults "
        f"in that step (new memory touched). Produced by {produced}.", "",
        table(["size", "variant", "reps", "steady step", "first step after a rebuild",
               "later steps after a rebuild", "first step over steady", "faults, steady step",
               "faults, first step after a rebuild", "allocator"],
              [row for d in docs for row in _rows(d)])])
