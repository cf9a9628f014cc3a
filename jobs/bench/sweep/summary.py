"""Per-mechanism summaries over repetitions: what the tables show."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scoring.stats import percentile, summary

SCORES = ("training_goodput", "goodput_after_startup", "infra_goodput_per_slot", "wall_s",
          "startup_s", "in_run_goodput", "steps_redone", "recovery_total_s", "useful_steps")


def summarize_faulty(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median and spread of each score over the ok runs, recovery per fault kind pooled over
    the runs (p50, max), usage, bit-equality counts."""
    ok = [r for r in records if r["status"] == "ok" and r.get("score")]
    out: dict[str, Any] = {"runs": len(records), "ok": len(ok),
                           "statuses": sorted({r["status"] for r in records})}
    for name in SCORES:
        out[name] = summary([r["score"][name] for r in ok])
    kinds: dict[str, list[float]] = {}
    for r in ok:
        for kind, times in r["score"]["recovery_s"].items():
            kinds.setdefault(kind, []).extend(times)
    out["recovery"] = {k: {"p50": percentile(v, 50), "max": max(v), "n": len(v)}
                       for k, v in sorted(kinds.items())}
    back = [t for r in ok for times in r["score"].get("full_world_back_s", {}).values()
            for t in times]
    out["full_world_back"] = ({"p50": percentile(back, 50), "max": max(back), "n": len(back)}
                              if back else None)
    out["faults_fired"] = summary([r.get("faults_fired") for r in ok])
    out["faults_planned"] = records[0]["faults_planned"] if records else 0
    for name in ("peak_rss_bytes", "peak_memory_bytes", "cpu_s"):
        out[name] = summary([(r.get("usage") or {}).get(name) for r in ok])
    for key in ("own", "family"):
        compared = [r[f"params_equal_{key}"] for r in ok
                    if r.get(f"params_equal_{key}") is not None]
        out[f"bit_equal_{key}"] = {"equal": sum(compared), "compared": len(compared)}
    out["errors"] = sorted({r["error"] for r in records if r.get("error")})
    return out


def overhead(steady: dict[str, float | None], baseline: str) -> dict[str, float | None]:
    """Fault-free steady step of each mechanism against `baseline`'s, as a fraction (0.1: 10%
    slower)."""
    base = steady.get(baseline)
    return {m: (s / base - 1.0) if s and base else None for m, s in steady.items()}
