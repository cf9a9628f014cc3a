"""The recovery-tier section of docs/benchmarks.md (from `tiers.json`, bench_tiers.py)."""

from __future__ import annotations

from typing import Any

from .fmt import NONE, mb, ms, num, pct, sec, table


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b - 1


def _modelled(auto: dict[str, Any]) -> float | None:
    """The local tier's cost as the schedule charges it: one write per interval."""
    cost, step, interval = auto.get("local_cost_s"), auto.get("local_step_s"), \
        auto.get("interval_steps")
    return None if cost is None or not step or not interval else cost / (interval * step)


def _cost_row(entry: dict[str, Any]) -> list[str]:
    got = entry["runs"]
    off, auto = got.get("off", {}), got.get("auto", {})
    snapshots = auto.get("local_snapshots")
    blocking = auto.get("local_blocking_s")
    per_write = None if not snapshots or blocking is None else blocking / snapshots
    return [entry["size"], mb(entry["state_bytes_per_rank"] / 1e6),
            num(auto.get("interval_steps")), ms(auto.get("local_cost_s")), ms(per_write),
            ms(off.get("step_s")), ms(auto.get("step_s")),
            pct(_ratio(auto.get("step_s"), off.get("step_s"))), pct(_modelled(auto), 2)]


def _recovery_row(entry: dict[str, Any]) -> list[str]:
    got = entry["runs"]
    fault = (got.get("auto") or {}).get("fault") or {}
    loads = {tier: ((got.get(tier) or {}).get("fault") or {}).get("load_s")
             for tier in ("memory", "storage")}
    return [entry["size"], num(fault.get("step")), num(fault.get("resumed_from")),
            num(fault.get("steps_redone")), sec(fault.get("recovery_s")),
            sec(fault.get("load_s")), sec(loads["memory"]), sec(loads["storage"])]


def section(doc: dict[str, Any]) -> str:
    rates = doc.get("checksum_gb_s") or {}
    failed = [f"{e['size']} {name}: {r['error'].rstrip('.')}" for e in doc["sizes"]
              for name, r in e["runs"].items() if not r["ok"]]
    lines = [
        "## Recovery tiers", "",
        "From `jobs/bench/bench_tiers.py` (" + doc["date_utc"] + "). `ResilienceConfig.default()` "
        "on 2 CPU ranks, the local tier's interval chosen by the run (`local_interval_steps="
        "\"auto\"`, budget 1% of step time). Write cost: what one local write costs training as "
        "the schedule charges it (training-thread wait, plus on CPU ranks the CPU time of the "
        "background copy, checksum and write); blocking: the training thread's part of it. Step "
        "times are rank 0's median wall time per step over the same steps of a run with the local "
        "tier off and of one with it on; modelled cost: write cost / (interval x step time). "
        f"Checksum: CRC-32C {num(rates.get('crc32c'), 1)} GB/s on this CPU (zlib CRC-32 "
        f"{num(rates.get('zlib_crc32'), 1)} GB/s).", "",
        table(["size", "state per rank", "interval (steps)", "write cost", "blocking per write",
               "step, tier off", "step, tier on", "step time vs off", "modelled cost"],
              [_cost_row(e) for e in doc["sizes"]]), "",
        "Recovery from an exception on rank 1 (the run with the local tier on), and restore time "
        "per tier: local from that run, memory and storage from runs with the tiers above them "
        "off. Recovery: fault to the next completed step.", "",
        table(["size", "fault at step", "resumed from", "steps redone", "recovery",
               "restore, local", "restore, memory", "restore, storage"],
              [_recovery_row(e) for e in doc["sizes"]]),
    ]
    if failed:
        lines += ["", "Runs that failed: " + "; ".join(failed) + "."]
    if doc.get("provenance"):
        lines += ["", f"Source: `{doc['command']}`, {doc['provenance']}."]
    return "\n".join(lines) if doc["sizes"] else NONE
