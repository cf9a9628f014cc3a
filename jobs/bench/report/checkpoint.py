"""The checkpoint-benchmark section of docs/benchmarks.md."""

from __future__ import annotations

from typing import Any

from .fmt import NONE, mb, ms, num, pct, spread, table

PAIRS = (("ours_block", "dcp_async", "both persist every save"),
         ("ours_coalesce", "dcp_async_skip", "both drop saves while one is in flight"),
         ("ours_local", "nvrx_local", "node-local tiers"))


def _whole(x: float) -> str:
    return pct(x, 0)


def _stale(row: dict[str, Any]) -> str:
    st = row["staleness"]
    if st["steps_median"] is None:
        return NONE
    return f"{num(st['steps_median'])} / {num(st['steps_p99'])} steps, {ms(st['seconds_median'])}"


def _cpu(row: dict[str, Any]) -> str:
    """The machine's extra CPU-seconds per save (older results did not measure it)."""
    cpu = row.get("cpu_per_save_s")
    return spread(cpu, lambda s: f"{s:.2f} s") if cpu and cpu["n"] else NONE


def _table(rows: list[dict[str, Any]]) -> str:
    headers = ["method", "blocking median", "blocking p99", "AWS efficiency",
               "throughput efficiency", "persisted", "staleness (median / p99, median age)",
               "held memory", "CPU per save"]
    body = [[r["method"] + ("" if r["durable"] else " (node-local)"), ms(r["blocking_median_s"]),
             ms(r["blocking_p99_s"]), spread(r["aws_efficiency"]),
             spread(r["throughput_efficiency"]), spread(r["persisted_fraction"], _whole),
             _stale(r), spread(r["held_mb"], mb), _cpu(r)] for r in rows]
    return table(headers, body)


def _intake(row: dict[str, Any]) -> str:
    """How ours' writers took the snapshots (adopted: the rank's staging memory, no copy)."""
    ways = {way: n for way, n in (row.get("intake") or {}).items() if n}
    if not ways:
        return ""
    return "; ours' writers took the snapshots " + ", ".join(
        f"{way} {n}" for way, n in ways.items()) + " (adopted: no copy)"


def _pair_lines(rows: list[dict[str, Any]]) -> list[str]:
    by = {r["method"]: r for r in rows}
    lines = []
    for ours, peer, why in PAIRS:
        a, b = by.get(ours), by.get(peer)
        if not a or not b:
            continue
        ta, tb = a["throughput_efficiency"]["median"], b["throughput_efficiency"]["median"]
        if ta is None or tb is None:
            continue
        verdict = "ahead" if ta > tb else ("behind" if ta < tb else "level")
        lines.append(f"- {ours} vs {peer} ({why}): throughput efficiency {pct(ta)} vs {pct(tb)} "
                     f"(ours {verdict}); blocking p99 {ms(a['blocking_p99_s'])} vs "
                     f"{ms(b['blocking_p99_s'])}; persisted "
                     f"{_whole(a['persisted_fraction']['median'])} vs "
                     f"{_whole(b['persisted_fraction']['median'])}; staleness {_stale(a)} vs "
                     f"{_stale(b)}; CPU per save {_cpu(a)} vs {_cpu(b)}{_intake(a)}.")
    return lines


def _rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows from the smallest state to the largest, each size's intervals ascending (a rerun
    of some sizes appends theirs after the sizes it kept)."""
    smallest: dict[str, float] = {}
    for row in doc["rows"]:
        mb_ = row.get("state_mb", 0.0)
        smallest[row["size"]] = min(mb_, smallest.get(row["size"], mb_))
    return sorted(doc["rows"], key=lambda r: (smallest[r["size"]], r.get("interval", 0)))


def _sittings(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Size -> the invocation that measured it (older documents: one for every size)."""
    given = doc.get("sittings", {})
    return {size: given.get(size, doc) for size in dict.fromkeys(r["size"] for r in _rows(doc))}


def _produced(size: str, sitting: dict[str, Any], failures: list[dict[str, Any]]) -> str:
    quick = " **Quick run** (`--quick`: 1 repetition on a shared, noisy machine)." \
        if sitting.get("quick") else ""
    failed = "".join(
        f" Failed, left out of its row: {f['method']} every {f['interval']} in repetition "
        f"{f['rep']} ({f['error']})." for f in failures if f["size"] == size)
    return (f"- {size}: `{sitting['command']}` on {sitting['date_utc']} "
            f"({sitting['duration_s']:.0f} s, {sitting['reps']} repetition(s)).{quick}{failed}")


def section(doc: dict[str, Any]) -> str:
    out = ["## Checkpoint benchmark", "",
           "Each size's repetitions interleave every method with a no-checkpoint run. Blocking "
           "is the slowest rank's, the next optimizer step's wait included; persisted = durable "
           "checkpoints / saves requested; staleness = age of the newest durable checkpoint "
           "(its own tier for node-local rows) at every step; held memory = what the method "
           "keeps for checkpoints once settled (ours: every buffer its writers have open, the "
           "memory tier's included, and the ranks' staging memory); CPU per save = the whole "
           "machine's busy CPU-seconds over the timed steps above the no-checkpoint run, per "
           "save (every process: ranks, writers, DCP's daemons). Before timing, every method "
           "makes two untimed warm-up saves, each durable before the next. Produced by:", ""]
    failures = doc.get("failures", [])
    out += [_produced(size, sitting, failures)
            for size, sitting in _sittings(doc).items()] + [""]
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in _rows(doc):
        groups.setdefault((row["size"], row["interval"]), []).append(row)
    for (size, interval), rows in groups.items():
        out += [f"### {size} ({mb(rows[0]['state_mb'])} of state on 2 ranks), save every "
                f"{interval} step(s), {rows[0]['steps']} steps", "", _table(rows), ""]
        lines = _pair_lines(rows)
        if lines:
            out += ["Like for like:", "", *lines, ""]
    return "\n".join(out)
