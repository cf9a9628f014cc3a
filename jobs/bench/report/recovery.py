"""The recovery sections of docs/benchmarks.md: one per result file (state size)."""

from __future__ import annotations

from typing import Any

from peers import NAMED_ONLY

from ray_resilience.goodput import RunTimeline, compute_goodput

from .fmt import NONE, gib, mb, ms, num, pct, sec, spread, table
from .prose import MEMORY, memory_key, ordered, time_breakdown, where_ours_loses

SCENARIO_TITLES = {
    "aws": "AWS/NVRx schedule (exception and SIGKILL)",
    "hang": "Hangs (a rank stops stepping)",
    "node_loss": "Node loss (simulated multi-node Ray cluster)",
}
SIDE_TITLES = {"hang": "hangs", "node_loss": "node loss"}


def _plan(plan: dict[str, Any]) -> str:
    return ", ".join(f"{f['kind']}@{f['step']} (rank {f['rank']})" for f in plan["faults"])


def _bit(s: dict[str, Any], key: str, comparable: bool) -> str:
    counts = s.get(f"bit_equal_{key}") or {}
    if not counts.get("compared"):
        return NONE
    text = f"{counts['equal']}/{counts['compared']}"
    return text if comparable else f"{text} (not expected)"


def _pooled(entry: dict[str, Any], wanted: int) -> str:
    """p50 and max of a pooled entry; "n of m faults" when it pools fewer than `wanted`."""
    pooled = "" if entry["n"] >= wanted else f"; {entry['n']} of {wanted} faults"
    return f"{sec(entry['p50'])} (max {sec(entry['max'])}{pooled})"


def _recovery(s: dict[str, Any], kind: str, planned: int) -> str:
    """p50 and max over the runs' faults of `kind`, against the ok runs' `planned` per run: a
    fault that never fired, or after which the mechanism completed no step, has no time."""
    entry = s["recovery"].get(kind)
    return NONE if entry is None else _pooled(entry, planned * s["ok"])


def _back(s: dict[str, Any], planned: int) -> str:
    """Fault to the full world training again, over every fault of the runs."""
    entry, wanted = s.get("full_world_back"), planned * s["ok"]
    if entry is None:
        return NONE if not s["recovery"] else f"not before the last step (0 of {wanted} faults)"
    return _pooled(entry, wanted)


def _allocator(doc: dict) -> str:
    """Names glibc's allocator settings where the sitting ran every mechanism with them."""
    env = doc.get("allocator_env")
    if not env:
        return ""
    return (" Every mechanism's processes ran with glibc told to keep freed memory ("
            + " ".join(f"`{k}={v}`" for k, v in env.items())
            + "; `--keep-freed-memory`, docs/design.md, section 8).")


CLUSTER_UTILS_STORE = 150 * 2**20
"""The object store `ray.cluster_utils` gave each simulated node in sittings that recorded no
cluster."""


def _cluster(doc: dict[str, Any], scenario: dict[str, Any]) -> str:
    """The simulated cluster, where the sitting recorded it; for older sittings, what their
    nodes' 150 MiB object stores did to ours' memory tier."""
    info = scenario.get("cluster")
    if not info:
        if doc["size"]["state_bytes_per_rank"] <= CLUSTER_UTILS_STORE:
            return ""
        return (" This sitting's simulated nodes had `ray.cluster_utils`' 150 MiB object store,"
                " to which ours' memory tier is budgeted by default: no writer kept a shard of"
                " this size in memory, so ours restored every rank from storage (the harness"
                " gives nodes Ray's default share of memory since).")
    return (f" Cluster: {info['description']} ({gib(info['node_object_store_bytes'])} per "
            "worker node; ours' memory tier is budgeted to it by default).")


def scenario_table(doc: dict[str, Any], name: str) -> str:
    scenario = doc["scenarios"][name]
    kinds = sorted({f["kind"] for f in scenario["plan"]["faults"]})
    planned = {k: sum(f["kind"] == k for f in scenario["plan"]["faults"]) for k in kinds}
    headers = ["mechanism", "training goodput", f"time to {doc['max_steps']} steps", "start-up",
               "goodput after start-up", "infra goodput / slot",
               *[f"{k} recovery p50" for k in kinds], "back to full world p50",
               "steps redone", "= own fault-free",
               "= FSDP/replica reference", MEMORY[memory_key(doc)], "CPU", "faults fired"]
    rows = []
    for mech in ordered(doc["mechanisms"]):
        info, s = doc["mechanisms"][mech], scenario["summary"].get(mech)
        if info.get("unavailable"):
            rows.append([mech, f"not run: {info['unavailable']}", *[""] * (len(headers) - 2)])
            continue
        blank = [""] * (len(headers) - 2)
        if mech in scenario["skipped"]:
            rows.append([mech, f"skipped: {scenario['skipped'][mech]}", *blank])
            continue
        if s is None:
            continue
        if not s["ok"]:
            rows.append([mech, f"failed: {'; '.join(s['errors'])[:200]}", *blank])
            continue
        comparable = info["bit_comparable"]
        rows.append([
            mech, spread(s["training_goodput"]), spread(s["wall_s"], sec),
            spread(s["startup_s"], sec), spread(s["goodput_after_startup"]),
            spread(s["infra_goodput_per_slot"]),
            *[_recovery(s, k, planned[k]) for k in kinds],
            _back(s, len(scenario["plan"]["faults"])), spread(s["steps_redone"], num),
            _bit(s, "own", comparable), _bit(s, "family", comparable),
            spread(s.get(memory_key(doc)), gib), spread(s["cpu_s"], sec),
            f"{spread(s['faults_fired'], num)}/{s['faults_planned']}"])
    return table(headers, rows)


def reference_table(doc: dict[str, Any]) -> str:
    headers = ["mechanism", "steady step", "vs torchrun", "fault-free training goodput",
               "fault-free time", "durable every", "local every", "durable save cost",
               "local save cost", "= FSDP/replica reference", MEMORY[memory_key(doc)], "CPU",
               "configuration"]
    rows = []
    for mech in ordered(doc["references"]):
        ref = doc["references"][mech]
        cal = doc["calibration"].get(mech, {})
        iv = doc["intervals"][mech]
        score = ref.get("score") or {}
        equal = ref.get("params_equal_family")
        rows.append([
            mech, _steady(ref), pct(doc["overhead_vs_torchrun"].get(mech)),
            pct(score.get("training_goodput")), sec(score.get("wall_s")),
            str(iv["durable"] or NONE), str(iv["local"] or NONE), ms(cal.get("durable_cost_s")),
            ms(cal.get("local_cost_s")), NONE if equal is None else ("yes" if equal else "NO"),
            gib((ref.get("usage") or {}).get(memory_key(doc))),
            sec((ref.get("usage") or {}).get("cpu_s")), _config(doc["mechanisms"][mech])])
    return table(headers, rows)


def _cost_rule(doc: dict[str, Any]) -> str:
    """How this sweep measured a durable save's cost (the harness changed on 2026-12-05)."""
    if any(c.get("no_save_step_s") for c in doc["calibration"].values()):
        return ("A durable save's cost is the calibration run's wall time beyond its own "
                "median step per save or, where that is more, beyond the same mechanism's run "
                "without saves (run just before it) less its local saves' blocking: a background "
                "save that slows every step counts in full, and the two runs' noise never "
                "lowers the run's own figure.")
    return ("A durable save's cost is the calibration run's wall time beyond its own median "
            "step, per save (this sweep predates the run without saves, so a background save's "
            "slowdown of every step hid in that median and its interval came out shorter).")


def _sittings(doc: dict[str, Any]) -> str:
    """", run in 2 sittings (commits a, b)" when the sweep was resumed, else ""."""
    sittings = doc.get("sittings") or []
    if len(sittings) <= 1:
        return ""
    commits = ", ".join(dict.fromkeys(str(s.get("commit")) for s in sittings))
    return (f"; run in {len(sittings)} sittings of {', '.join(str(s['runs']) for s in sittings)}"
            f" runs, commits {commits}")


def _rescored(doc: dict[str, Any]) -> str:
    """" Re-scored from the committed timelines on <date> (<fields>): <why>." per re-score."""
    return "".join(
        f" Re-scored from the committed timelines by `jobs/bench/rescore.py` on {e['date_utc']} "
        f"UTC ({', '.join(e['fields'])})" + (f": {e['note']}." if e.get("note") else ".")
        for e in doc.get("rescored") or [])


def _steady(ref: dict[str, Any]) -> str:
    """The median steady step over the reference's repetitions, with their range."""
    steps = [r["steady_step_s"] for r in ref.get("repetitions", [])
             if r.get("steady_step_s") is not None]
    if len(steps) <= 1:
        return ms(ref.get("steady_step_s"))
    return spread({"median": ref["steady_step_s"], "min": min(steps), "max": max(steps),
                   "n": len(steps)}, ms)


def _config(info: dict[str, Any]) -> str:
    spares = info["num_spares"]
    return info["config"] + (f" ({spares} idle slot{'s' if spares > 1 else ''} charged)"
                             if spares else "")


RESUME_NOTES = {
    "node_loss": "A lost node's local tier goes with it, so ours resumes from the newest commit "
                 "(the memory tier's replica on a live node, else storage), and a node lost "
                 "before the run's first commit starts over from step 0: the first commit waits "
                 "for the writers' import of torch's DCP, which starts after the run's first "
                 "step (design.md, section 6), while Ray Train saves inside its loop. The "
                 "simulated node's processes die a moment after the fault fires and the ranks "
                 "step on meanwhile, so the last step reached can pass the fault's step; the "
                 "table's steps redone count from the last step reached.",
}


def resume_points(doc: dict[str, Any], timelines: dict[str, Any] | None, name: str) -> str:
    """Per mechanism, from its first run of scenario `name`: the last step reached before each
    restart, the step resumed from and the tier loaded (none: it started over)."""
    if not timelines:
        return ""
    parts = []
    for mech in ordered(doc["mechanisms"]):
        runs = sorted(k for k in timelines if k.split("-", 1)[1].startswith(f"{mech}-{name}-rep"))
        if not runs:
            continue
        report = compute_goodput(RunTimeline.from_dict(timelines[runs[0]]))
        points = [f"{f.step_reached} → {f.resumed_from_step} ({f.checkpoint_tier or 'none'})"
                  for f in report.faults if f.resumed_from_step is not None]
        if points:
            parts.append(f"{mech} {', '.join(points)}")
    if not parts:
        return ""
    return ("Where each restart resumed (each mechanism's first run: the last step reached → the "
            "step resumed from, and the tier loaded): " + "; ".join(parts) + ". "
            + RESUME_NOTES.get(name, "")).rstrip()


def section(doc: dict[str, Any], timelines: dict[str, Any] | None = None) -> str:
    size = doc["size"]
    label = ", glibc keeping freed memory" if doc.get("allocator_env") else ""
    if "aws" not in doc["scenarios"]:
        label += (", " + " and ".join(SIDE_TITLES.get(n, n) for n in doc["scenarios"])
                 + (" in a sitting of their own" if len(doc["scenarios"]) > 1
                    else " in a sitting of its own"))
    named = [m for m in doc["mechanisms"] if m in NAMED_ONLY]
    if named:
        label += ", with " + " and ".join(named)
    out = [f"## Recovery: {size['name']}{label} ({mb(size['state_bytes_per_rank'] / 1e6)} of "
           f"state per rank, {doc['max_steps']} steps)", ""]
    if doc["quick"]:
        out += ["**Quick run** (`--quick`: short runs, 1 repetition, a shared and noisy machine): "
                "it shows the harness works, not where the mechanisms stand.", ""]
    stick = doc.get("yardstick")
    out += [f"Produced by `{doc['command']}` on {doc['date_utc']} ({doc['duration_s']:.0f} s; "
            + (f"AWS schedule {doc['reps']} repetition(s), " if "aws" in doc["scenarios"] else "")
            + "fault-free reference "
            f"{doc.get('ref_reps', 1)}, other scenarios {doc.get('side_reps', doc['reps'])}; "
            f"medians with min–max{_sittings(doc)}). Yardstick: "
            + (f"{stick['mechanism']}'s fault-free steady step, {ms(stick['step_s'])}."
               if stick else "none (no fault-free run finished).")
            + f" Hang detection timeout, the same for every mechanism: "
              f"{size['detect_timeout_s']:g} s.{_rescored(doc)}{_allocator(doc)}", ""]
    for name, scenario in doc["scenarios"].items():
        out += [f"### {SCENARIO_TITLES.get(name, name)}", "",
                f"Plan: {_plan(scenario['plan'])}."
                + (_cluster(doc, scenario) if name == "node_loss" else ""), "",
                scenario_table(doc, name), ""]
        resumed = resume_points(doc, timelines, name) if name != "aws" else ""
        for block in (time_breakdown(doc, name), "\n".join(where_ours_loses(doc, name)), resumed):
            if block:
                out += [block, ""]
    out += ["### Fault-free runs, intervals, per-step overhead and configurations", "",
            "Each mechanism's intervals come from its own calibration run: Young's interval for "
            "what one save of that tier cost the run, with the AWS plan's mean time between "
            f"faults. {_cost_rule(doc)} Every fault-free run is compared bit for bit with its "
            "family's reference (torchrun for the FSDP mechanisms, torchft for the replicated "
            "ones).",
            "", reference_table(doc), ""]
    return "\n".join(out).rstrip()
