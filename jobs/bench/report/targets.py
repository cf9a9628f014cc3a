"""The issue's targets, checked against the AWS-schedule results of every size."""

from __future__ import annotations

from typing import Any

from .fmt import NONE, pct, sec, table
from .prose import OURS, _median, faults_met

EXCEPTION_FACTOR = 5.0
SIGKILL_FACTOR = 2.0


def _best(values: dict[str, float | None], higher: bool) -> tuple[str, float] | None:
    known = {m: v for m, v in values.items() if v is not None}
    if not known:
        return None
    best = (max if higher else min)(known, key=lambda m: (known[m], m))
    return best, known[best]


def faced_every_fault(s: dict[str, Any]) -> bool:
    """Whether a mechanism's runs met every planned fault (`faults_met`): a run with fewer
    faults is not the same work."""
    met, planned = faults_met(s)
    return planned > 0 and met >= planned


def fewer_faults(doc: dict[str, Any]) -> dict[str, str]:
    """Peers of the AWS scenario left out of the targets: {mechanism: "met of planned"}."""
    scenario = doc["scenarios"].get("aws") or {"summary": {}}
    return {m: "{} of {}".format(*faults_met(s))
            for m, s in scenario["summary"].items()
            if not m.startswith(OURS) and s["ok"] and not faced_every_fault(s)}


def step_floor(doc: dict[str, Any]) -> tuple[str, float] | None:
    """The fastest fault-free steady step of the FSDP mechanisms at this size: recovery is
    timed from the fault to the next completed step, so no FSDP run can recover faster than
    one step of its work (None: no reference recorded one)."""
    return _best({m: r.get("steady_step_s") for m, r in doc.get("references", {}).items()
                  if doc["mechanisms"].get(m, {}).get("family") == "fsdp"}, False)


def _verdict(met: bool | None, needed: float | None, floor: tuple[str, float] | None) -> str:
    if met is None:
        return NONE
    if met:
        return "met"
    if needed is not None and floor is not None and needed < floor[1]:
        step = f"{sec(floor[1])}, {floor[0]}"
        return f"missed; out of reach: {sec(needed)} is below one step ({step})"
    return "missed"


def rows_for(doc: dict[str, Any]) -> list[list[str]]:
    scenario = doc["scenarios"].get("aws")
    ours = scenario["summary"].get(OURS) if scenario else None
    if not ours:
        return []
    if not ours["ok"]:  # every target missed: said, not left out
        return [[doc["size"]["name"], "every target",
                 f"no run of ours finished (of {ours['runs']})", NONE, "missed"]]
    peers = {m: s for m, s in scenario["summary"].items()
             if not m.startswith(OURS) and s["ok"] and faced_every_fault(s)}
    no_spares = {m: s for m, s in peers.items() if not doc["mechanisms"][m]["num_spares"]}
    size, rows = doc["size"]["name"], []

    def add(target: str, mine: float | None, best: tuple[str, float] | None, fmt: Any,
            met: bool | None, needed: float | None = None) -> None:
        rows.append([size, target, NONE if mine is None else fmt(mine),
                     NONE if best is None else f"{fmt(best[1])} ({best[0]})",
                     _verdict(met, needed, floor)])

    floor = step_floor(doc)

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
            None if mine is None or best is None else mine * factor <= best[1],
            None if best is None else best[1] / factor)
    return rows


def left_out_note(docs: list[dict[str, Any]]) -> str:
    """A sentence naming the peers the targets left out for meeting fewer faults ("" if none)."""
    left_out = [f"{m} at {doc['size']['name']} ({met} faults met over its runs)"
                for doc in docs for m, met in sorted(fewer_faults(doc).items())]
    if not left_out:
        return ""
    return ("Left out for meeting fewer faults than planned, a fault being met when the "
            "mechanism completed a step after it (their rows show what they did): "
            + "; ".join(left_out) + "."
            + (" A torchft replica restarts while the other trains on alone; when the other "
               "reaches the last step first, the restarted replica's later faults never fire, "
               "or, where Ray Train restarts it with no live peer left to heal from, fire while "
               "it trains alone after the run's last step, where they cost the measured run "
               "nothing."
               if any(m.startswith(("torchft", "ray-train-torchft"))
                      for doc in docs for m in fewer_faults(doc)) else ""))


def section(docs: list[dict[str, Any]]) -> str:
    rows = [r for doc in docs for r in rows_for(doc)]
    if not rows:
        return ""
    note = left_out_note(docs)
    return "\n".join([
        "## Targets (issue 22)", "",
        "Ours (the default configuration) against the best peer of each column, AWS schedule, "
        "among the peers whose runs met every planned fault (the same work). A recovery is "
        "timed from the fault to the next completed step, so it cannot be shorter than one "
        "fault-free step: where the target asks for less than the fastest FSDP mechanism's "
        "step at that size, the result says it is out of reach on this machine.", "",
        table(["size", "target", "ours", "best peer", "result"], rows)]
        + (["", note] if note else []))
