"""Template prose filled with measured numbers: where the time goes, where ours loses."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from peers import MECHANISMS

from .fmt import gib, num, pct, sec, table

OURS = "ours"
#: (label, summary key, formatter, higher is better)
METRICS = (
    ("training goodput", "training_goodput", pct, True),
    ("time to the last step", "wall_s", sec, False),
    ("start-up", "startup_s", sec, False),
    ("infra goodput per slot", "infra_goodput_per_slot", pct, True),
    ("steps redone", "steps_redone", num, False),
    ("peak memory", "peak_memory_bytes", gib, False),
    ("CPU time", "cpu_s", sec, False),
)
PARTS = ("start-up", "steady steps", "recoveries", "redone steps", "other")


MEMORY = {"peak_memory_bytes": "peak memory (private + shared)",
          "peak_rss_bytes": "peak RSS (sum over processes)"}
"""Memory columns, newest measure first (`harness/resources.py`). Results from before the
private + shared measure have only the RSS sum, which counts a shared page once per process
that touched it (Ray's object store many times over)."""


def memory_key(doc: dict[str, Any]) -> str:
    """The memory measure every finished run of `doc` has: private + shared, else the RSS sum."""
    usages = [r.get("usage") or {} for s in doc["scenarios"].values() for r in s["runs"]
              if r.get("status") == "ok"]
    usages += [r.get("usage") or {} for r in doc["references"].values()
               if r.get("status") == "ok"]
    if usages and all(u.get("peak_memory_bytes") for u in usages):
        return "peak_memory_bytes"
    return "peak_rss_bytes"


def ordered(names: Iterable[str]) -> list[str]:
    """Mechanism names in the benchmark's order (result files sort their keys)."""
    order = list(MECHANISMS)
    return sorted(names, key=lambda m: (order.index(m) if m in order else len(order), m))


def _median(s: dict[str, Any] | None, key: str) -> float | None:
    return ((s or {}).get(key) or {}).get("median")


def breakdown(doc: dict[str, Any], scenario: str, mech: str) -> dict[str, float] | None:
    """Median wall split into start-up, N fault-free steps, recoveries (fault to first step),
    steps redone and the rest (checkpoint saves, slower steps after faults, shutdown)."""
    s = doc["scenarios"][scenario]["summary"].get(mech)
    steady = doc["references"].get(mech, {}).get("steady_step_s")
    wall = _median(s, "wall_s")
    if not s or not s["ok"] or steady is None or wall is None:
        return None
    parts = {"start-up": _median(s, "startup_s") or 0.0,
             "steady steps": doc["max_steps"] * steady,
             "recoveries": _median(s, "recovery_total_s") or 0.0,
             "redone steps": (_median(s, "steps_redone") or 0.0) * steady}
    parts["other"] = wall - sum(parts.values())
    return parts | {"wall": wall}


UNRELIABLE_OTHER = 0.05
"""An "other" below minus this share of the wall marks the row's split as unreliable."""


def time_breakdown(doc: dict[str, Any], scenario: str) -> str:
    rows, unreliable = [], []
    for mech in ordered(doc["mechanisms"]):
        parts = breakdown(doc, scenario, mech)
        if parts is not None:
            rows.append([mech, *(sec(parts[p]) for p in PARTS), sec(parts["wall"])])
            if parts["other"] < -UNRELIABLE_OTHER * parts["wall"]:
                unreliable.append(mech)
    if not rows:
        return ""
    text = ("Where the time goes (medians; steady steps = steps x the mechanism's own fault-free "
            "step; other = checkpoint saves, slower steps after a restart, shutdown):\n\n"
            + table(["mechanism", *PARTS, "wall"], rows))
    if unreliable:
        refs = doc.get("ref_reps", 1)
        text += (f"\n\nNot to be trusted for {', '.join(unreliable)}: \"other\" is below "
                 f"-{UNRELIABLE_OTHER:.0%} of the wall, so the mechanism's own fault-free step "
                 f"(from {refs} fault-free reference run{'s' if refs != 1 else ''}) was slower "
                 "than its steps in these runs; the columns beside it are then misallocated.")
    return text


def faults_met(s: dict[str, Any]) -> tuple[int, int]:
    """(faults met, faults planned), pooled over a mechanism's ok runs. A fault is met when the
    mechanism completed a step after it (it has a recovery time): a fault that never fired, or
    fired after the mechanism's last step, cost the measured run nothing. Both happen to torchft
    replicas: one restarts while its peer trains on alone, and when the peer reaches the last
    step first the restarted one's later faults never fire, or (Ray Train's `TorchftConfig`,
    which restarts it with no live peer left to heal from) fire while it trains alone after
    the run's last step."""
    met = sum(entry.get("n", 0) for entry in (s.get("recovery") or {}).values())
    return met, s.get("faults_planned", 0) * s.get("ok", 0)


def _peers(doc: dict[str, Any], scenario: str) -> dict[str, dict[str, Any]]:
    summaries = doc["scenarios"][scenario]["summary"]
    return {m: s for m, s in summaries.items() if not m.startswith(OURS) and s["ok"]}


def _named(mech: str, s: dict[str, Any]) -> str:
    """The peer's name, with how many faults it met where that is fewer than planned."""
    met, planned = faults_met(s)
    return mech if met >= planned else f"{mech} ({met} of {planned} faults met)"


def _better(a: float, b: float, higher: bool) -> bool:
    return a > b if higher else a < b


def _failures(doc: dict[str, Any], scenario: str) -> list[str]:
    """Runs of ours that did not finish, with their errors, and the peers that finished all."""
    ours = doc["scenarios"][scenario]["summary"].get(OURS)
    if not ours or ours["ok"] == ours["runs"]:
        return []
    whole = [m for m, s in _peers(doc, scenario).items() if s["ok"] == s["runs"]]
    return [f"- ours finished {ours['ok']} of {ours['runs']} runs"
            + (f" ({'; '.join(ours['errors'])})" if ours.get("errors") else "")
            + (f"; every run of {', '.join(ordered(whole))} finished." if whole else ".")]


def where_ours_loses(doc: dict[str, Any], scenario: str) -> list[str]:
    ours = doc["scenarios"][scenario]["summary"].get(OURS)
    peers = _peers(doc, scenario)
    failed = _failures(doc, scenario)
    if not ours or not ours["ok"] or not peers:
        return ["Where ours loses:", "", *failed] if failed else []
    lines, memory = list(failed), memory_key(doc)
    for label, key, fmt, higher in METRICS:
        if key == "peak_memory_bytes":
            label, key = MEMORY[memory], memory
        mine = _median(ours, key)
        known = {m: _median(s, key) for m, s in peers.items() if _median(s, key) is not None}
        if mine is None or not known:
            continue
        best = (max if higher else min)(known, key=lambda m: (known[m], m))
        if _better(known[best], mine, higher):
            lines.append(f"- {label}: ours {fmt(mine)}, {_named(best, peers[best])} "
                         f"{fmt(known[best])}.")
    for kind, entry in sorted(ours["recovery"].items()):
        known = {m: s["recovery"][kind]["p50"] for m, s in peers.items() if kind in s["recovery"]}
        if known:
            best = min(known, key=lambda m: (known[m], m))
            if known[best] < entry["p50"]:
                lines.append(f"- {kind} recovery p50: ours {sec(entry['p50'])}, "
                             f"{_named(best, peers[best])} {sec(known[best])}.")
    if not lines:
        return ["Ours is ahead of every peer on every column of this table."]
    gap = _gap(doc, scenario, peers)
    return ["Where ours loses (medians):", "", *lines, *(["", gap] if gap else [])]


def _gap(doc: dict[str, Any], scenario: str, peers: dict[str, dict[str, Any]]) -> str:
    """Ours' wall against the fastest peer's, split by `breakdown`."""
    walls = {m: _median(s, "wall_s") for m, s in peers.items() if _median(s, "wall_s")}
    mine = breakdown(doc, scenario, OURS)
    if not walls or mine is None:
        return ""
    fastest = min(walls, key=lambda m: (walls[m], m))
    theirs = breakdown(doc, scenario, fastest)
    if theirs is None:
        return ""
    deltas = sorted(((mine[p] - theirs[p], p) for p in PARTS), reverse=True)
    parts = ", ".join(f"{p} {d:+.1f} s" for d, p in deltas)
    return (f"Against the fastest peer to the last step, {_named(fastest, peers[fastest])}, "
            f"ours' wall differs by "
            f"{mine['wall'] - theirs['wall']:+.1f} s: {parts}.")
