"""The tables of docs/scale.md, computed from the committed benchmark results.

    python jobs/bench/controlplane/scale.py           # rewrite the generated block of docs/scale.md
    python jobs/bench/controlplane/scale.py --check   # exit 1 if it is stale

Goodput(N) = (1 - C) x max(0, 1 - lambda(N) x E[loss per failure]), shown with C = 0 and with
C as measured on the tiny model, lambda(N) = N x the per-GPU
interruption rate of Llama 3 (419 unexpected in 54 days on 16,384 GPUs), E[loss] = the failure
mix's downtime plus the redone work. Every input is a measured figure, a published one (cited in
docs/scale.md) or an assumption named in `ASSUMED`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

BENCH = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(os.path.dirname(BENCH))
sys.path[:0] = [ROOT, BENCH]

from report.fmt import NONE, pct, table  # noqa: E402 - after the path set-up above

from ray_resilience._internal.control.node_agent import forward_interval_s  # noqa: E402

START, END = "<!-- scale:generated:start -->", "<!-- scale:generated:end -->"
LLAMA3 = {"interruptions": 419, "days": 54, "gpus": 16_384}
"""Unexpected interruptions of the Llama 3 405B pre-training snapshot (docs/scale.md, [1])."""
ASSUMED = {"step_s": 10.0, "mix": {"crash": 0.8, "node": 0.1, "hang": 0.1}, "gpus_per_node": 8}
"""Not measured, not published: a step time at scale, how failures split into a dead rank, a
lost node and a hang, and GPUs per node."""
SIZES = (1_024, 16_384, 131_072)
SYSTEMS = (("ours", "ours", 120.0, "step_timeout_s default"),
           ("NVRx ft_launcher", "ft-launcher", 2700.0, "rank_heartbeat_timeout default [2]"),
           ("Ray Train", "ray-train", 1800.0, "TorchConfig.timeout_s default [3]"))
"""(label, mechanism in the recovery benchmark, hang detection at defaults, its source)."""


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def inputs(recovery: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per system: downtime per failure kind (s), redone steps per fault, checkpoint stall."""
    runs = {(sc, r["mechanism"]): r["score"] for sc, body in recovery["scenarios"].items()
            for r in body["runs"] if r.get("status") == "ok" and r.get("score")}
    configured = float(recovery["size"]["detect_timeout_s"])
    out = {}
    for label, mech, hang_default, _ in SYSTEMS:
        aws, hang, node = (runs.get((sc, mech), {}) for sc in ("aws", "hang", "node_loss"))
        crash = _median([x for v in aws.get("recovery_s", {}).values() for x in v])
        hang_r = _median(hang.get("recovery_s", {}).get("hang", []))
        cal = recovery["calibration"].get(mech, {})
        iv = recovery["intervals"].get(mech, {})
        stall = sum((cal.get(f"{k}_cost_s") or 0.0) / iv[k] for k in ("local", "durable")
                    if iv.get(k)) / cal["steady_step_s"] if cal.get("steady_step_s") else None
        out[label] = {
            "crash_s": crash, "node_s": _median(node.get("recovery_s", {}).get("node_loss", [])),
            "hang_s": None if hang_r is None else hang_r - configured + hang_default,
            "redone_per_fault": aws["steps_redone"] / aws["faults"] if aws.get("faults") else None,
            "stall": stall}
    return out


def goodput(x: dict[str, Any], gpus: int, *, with_stall: bool) -> float | None:
    mix = ASSUMED["mix"]
    node_s = x["node_s"] if x["node_s"] is not None else x["crash_s"]
    parts = (x["crash_s"], node_s, x["hang_s"], x["redone_per_fault"], x["stall"])
    if any(p is None for p in parts):
        return None
    loss = (mix["crash"] * x["crash_s"] + mix["node"] * node_s + mix["hang"] * x["hang_s"]
            + x["redone_per_fault"] * ASSUMED["step_s"])
    rate = LLAMA3["interruptions"] / (LLAMA3["days"] * 86_400) * gpus / LLAMA3["gpus"]
    return (1 - x["stall"] if with_stall else 1.0) * max(0.0, 1 - rate * loss)


def _s(x: float | None) -> str:
    return NONE if x is None else f"{x:.1f} s"


def control_rows(cp: dict[str, Any]) -> list[list[str]]:
    """Supervisor CPU at each size from the largest measured N: CPU per batch x batches/s."""
    e = max(cp["sizes"], key=lambda s: s["world_size"])
    per_batch = e["steady"]["supervisor_cpu_core_fraction"] / max(e["steady"]["batches_per_s"], 1)
    rows = []
    for gpus in SIZES:
        nodes = gpus // ASSUMED["gpus_per_node"]
        rate = nodes / forward_interval_s(cp["settings"]["interval"], nodes)
        rows.append([f"{gpus:,}", f"{nodes:,}", f"{rate:,.0f}", pct(per_batch * rate, 0)])
    return rows


def generated(recovery: dict[str, Any], cp: dict[str, Any] | None) -> str:
    x = inputs(recovery)
    mtbf = {g: LLAMA3["days"] * 24 / LLAMA3["interruptions"] * LLAMA3["gpus"] / g for g in SIZES}
    parts = [
        "Inputs per system (measured by `jobs/bench/bench_recovery.py` at size "
        f"`{recovery['size']['name']}`; hang downtime = the measured hang recovery less its "
        "configured timeout, plus the default timeout):", "",
        table(["system", "dead rank", "lost node", "hang (defaults)", "redone steps / fault",
               "checkpoint stall"],
              [[k, _s(v["crash_s"]), _s(v["node_s"]), _s(v["hang_s"]),
                NONE if v["redone_per_fault"] is None else f"{v['redone_per_fault']:.1f}",
                NONE if v["stall"] is None else pct(v["stall"])] for k, v in x.items()]), "",
        "Goodput with the failures alone, `1 - lambda(N) x L` (C = 0):", "",
        table(["GPUs", "job MTBF", *x], [[f"{g:,}", f"{mtbf[g]:.2f} h",
                                          *(pct(goodput(v, g, with_stall=False))
                                            for v in x.values())] for g in SIZES]), "",
        "With the checkpoint stall measured on the tiny model (an upper bound on C at scale):", "",
        table(["GPUs", *x], [[f"{g:,}", *(pct(goodput(v, g, with_stall=True))
                                          for v in x.values())] for g in SIZES])]
    if cp is not None:
        parts += ["", "Supervisor load with each node's agent forwarding one batch every "
                  "max(progress interval, nodes / 400) s, from the largest control-plane run "
                  "(CPU per batch measured there):", "",
                  table(["GPUs", "nodes", "batches/s", "supervisor CPU (1 core = 100%)"],
                        control_rows(cp))]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--check", action="store_true")
    p.add_argument("--page", default=os.path.join(ROOT, "docs", "scale.md"))
    args = p.parse_args(argv)
    results = os.path.join(ROOT, "docs", "benchmarks")
    with open(os.path.join(results, "recovery-tiny.json"), encoding="utf-8") as f:
        recovery = json.load(f)
    cp_path = os.path.join(results, "control_plane", "control_plane.json")
    cp = None
    if os.path.exists(cp_path):
        with open(cp_path, encoding="utf-8") as f:
            cp = json.load(f)
    with open(args.page, encoding="utf-8") as f:
        page = f.read()
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{START}\n{generated(recovery, cp)}\n{END}{tail}"
    if args.check:
        print("up to date" if new == page else f"{args.page} is stale: rerun scale.py")
        return 0 if new == page else 1
    with open(args.page, "w", encoding="utf-8") as f:
        f.write(new)
    print(f"wrote {args.page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
