"""The control-plane section of docs/benchmarks.md, from docs/benchmarks/control_plane/*.json.

Schema ("control_plane/1"): top level `quick`, `date_utc`, `command`, `duration_s`, `machine`,
`settings` (the benchmark's arguments), `ranks_per_node`, and `sizes`, one entry per N:
`world_size`, `nodes`; `steady` and `steady_after` (`supervisor_cpu_core_fraction`,
`supervisor_rss_mb`, `batches_per_s`, `reports_per_s`, `steps_per_s`); `dead_rank`, `hung_rank`,
`lost_node`: lists of trials (`detect_s`: fault to detection, `launch_s`: detection to the new
attempt's run calls issued, `cause`; a trial that failed has only `error`); `memory`: [steps since
the start, supervisor RSS MB] samples or null; `save_rounds`: per mode (`per_rank`, `per_node`)
`round_s` (list), `claimed_fraction`, `coordinator_cpu_s_per_round`, `coordinator_rss_mb`;
`run_state`, `control` (the run's counters).
"""

from __future__ import annotations

from typing import Any

from .fmt import NONE, ms, num, pct, table

SCHEMA = "control_plane/1"


def quantile(values: list[float], q: float) -> float | None:
    """Nearest-rank quantile (with few trials, p99 is the worst one)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))]


def values(trials: list[dict[str, Any]], key: str) -> list[float]:
    """`key` of the trials that completed (a failed trial has `error` instead)."""
    return [t[key] for t in trials if key in t]


def _p(trials: list[dict[str, Any]], key: str = "detect_s") -> str:
    got = values(trials, key)
    failed = len(trials) - len(got)
    if not got:
        return NONE if not failed else f"{failed} failed"
    out = f"{ms(quantile(got, 0.5))} / {ms(quantile(got, 0.99))} (n={len(got)}"
    return out + (f", {failed} failed)" if failed else ")")


def memory_growth(samples: list[list[float]] | None) -> dict[str, float] | None:
    """RSS at 10% of the run and at its end, and the slope over the second half (bytes/step)."""
    if not samples or len(samples) < 4:
        return None
    steps = samples[-1][0]
    early = next(s for s in samples if s[0] >= 0.1 * steps)
    half = next(s for s in samples if s[0] >= 0.5 * steps)
    span = max(samples[-1][0] - half[0], 1)
    return {"steps": steps, "rss_early_mb": early[1], "rss_end_mb": samples[-1][1],
            "slope_bytes_per_step": (samples[-1][1] - half[1]) * 2**20 / span}


def _rounds(entry: dict[str, Any], mode: str) -> str:
    r = entry["save_rounds"].get(mode)
    if not r:
        return NONE
    return f"{ms(quantile(r['round_s'], 0.5))} ({r['coordinator_cpu_s_per_round']:.2f} s CPU)"


def _row(e: dict[str, Any]) -> list[str]:
    steady = e["steady"]
    grow = memory_growth(e.get("memory"))
    mem = NONE if grow is None else (f"{grow['rss_early_mb']:.0f} → {grow['rss_end_mb']:.0f} MB "
                                     f"over {grow['steps']:.0f} steps")
    return [str(e["world_size"]), str(e["nodes"]), pct(steady["supervisor_cpu_core_fraction"]),
            f"{steady['supervisor_rss_mb']:.0f} MB", num(steady["batches_per_s"]),
            num(steady["reports_per_s"]), _p(e["dead_rank"]), _p(e["hung_rank"]),
            _p(e["lost_node"]), _p(e["dead_rank"] + e["hung_rank"], "launch_s"),
            _rounds(e, "per_rank"), _rounds(e, "per_node"), mem]


def _machine(m: dict[str, Any]) -> str:
    """The host's size and load: every process of the simulation shares it."""
    if not m.get("cores"):
        return ""
    load = m.get("load_average_at_start") or [None]
    end = m.get("load_average_at_end") or [None]
    return (f", one {m['cores']}-core machine for every simulated node, 1-min load average "
            f"{load[0]} at the start and {end[0]} at the end")


def section(doc: dict[str, Any]) -> str:
    s = doc["settings"]
    out = ["## Control plane at scale (simulated ranks)", ""]
    if doc["quick"]:
        out += ["**Quick run** (`--quick`: the smaller sizes, fewer trials).", ""]
    out += [
        f"Produced by `{doc['command']}` on {doc['date_utc']} ({doc['duration_s']:.0f} s"
        f"{_machine(doc.get('machine') or {})}). "
        "The real supervisor, node agents, detection, recovery policy and commit coordinator; "
        f"the ranks are virtual ({doc['ranks_per_node']} per simulated node, many per process, "
        "no torch) and send what a rank sends: a heartbeat every "
        f"{s['interval']} s to their node's agent, a report per step ({s['step_s']} s steps). "
        "A dead rank's run future returns a death; a hung rank keeps its heartbeats but stops "
        f"stepping and moving (step timeout {s['step_timeout']} s; heartbeat timeout "
        f"{s.get('heartbeat_timeout', 10.0)} s); a lost node is a Ray node "
        "of the local cluster killed with its processes. Detection is timed from the fault to "
        "the supervisor's fault event; decide + launch from there to the new attempt's run "
        "calls. Save rounds: every rank votes ready in one round of the real coordinator, one "
        "call per rank or one per node; the time is the first vote to the last rank knowing "
        "the outcome. CPU is a fraction of one core.", "",
        table(["N", "nodes", "supervisor CPU", "supervisor RSS", "batches/s", "reports/s",
               "dead rank p50 / p99", "hung rank p50 / p99", "lost node p50 / p99",
               "decide + launch p50 / p99", "save round, per-rank votes",
               "save round, per-node votes", "supervisor memory, long run"],
              [_row(e) for e in doc["sizes"]]), "",
        "![control plane against N](benchmarks/control_plane/control_plane.png)"]
    return "\n".join(out)
