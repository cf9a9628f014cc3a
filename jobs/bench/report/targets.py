"""The issue's targets, checked against the AWS-schedule results of every size."""

from __future__ import annotations

from typing import Any

from .fmt import NONE, pct, sec, table
from .prose import OURS, _median

EXCEPTION_FACTOR = 5.0
SIGKILL_FACTOR = 2.0


def _best(values: dict[str, float | None], higher: bool) -> tuple[str, float] | None:
    known = {m: v for m, v in values.items() if v is not None}
    if not known:
        return None
    best = (max if higher else min)(known, key=lambda m: (known[m], m))
    return best, known[best]


def rows_for(doc: dict[str, Any]) -> list[list[str]]:
    scenario = doc["scenarios"].get("aws")
    ours = scenario["summary"].get(OURS) if scenario else None
    if not ours or not ours["ok"]:
        return []
    peers = {m: s for m, s in scenario["summary"].items() if not m.startswith(OURS) and s["ok"]}
    no_spares = {m: s for m, s in peers.items() if not doc["mechanisms"][m]["num_spares"]}
    size, rows = doc["size"]["name"], []

    def add(target: str, mine: float | None, best: tuple[str, float] | None, fmt: Any,
            met: bool | None) -> None:
        rows.append([size, target, NONE if mine is None else fmt(mine),
                     NONE if best is None else f"{fmt(best[1])} ({best[0]})",
                     NONE if met is None else ("met" if met else "missed")])

    goodput = _best({m: _median(s, "training_goodput") for m, s in peers.items()}, True)
    mine = _median(ours, "training_goodput")
    add("training goodput above every peer", mine, goodput, pct,
        None if mine is None or goodput is None else mine > goodput[1])
    wall = _best({m: _median(s, "wall_s") for m, s in peers.items()}, False)
    mine = _median(ours, "wall_s")
    add(f"time to {doc['max_steps']} steps below every peer", mine, wall, sec,
        None if mine is None or wall is None else mine < wall[1])
    for kind, factor, pool in (("exception", EXCEPTION_FACTOR, peers),
                               ("sigkill", SIGKILL_FACTOR, no_spares)):
        entry = ours["recovery"].get(kind)
        best = _best({m: s["recovery"].get(kind, {}).get("p50") for m, s in pool.items()}, False)
        mine = entry["p50"] if entry else None
        add(f"{kind} recovery p50 {factor:g}x faster than the fastest peer", mine, best, sec,
            None if mine is None or best is None else mine * factor <= best[1])
    return rows


def section(docs: list[dict[str, Any]]) -> str:
    rows = [r for doc in docs for r in rows_for(doc)]
    if not rows:
        return ""
    return "\n".join([
        "## Targets (issue 22)", "",
        "Ours (the default configuration) against the best peer of each column, AWS schedule:", "",
        table(["size", "target", "ours", "best peer", "result"], rows)])
