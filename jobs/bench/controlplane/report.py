"""The control-plane benchmark's JSON summary line and its plot (each figure against N)."""

from __future__ import annotations

from typing import Any

from report.control_plane import SCHEMA, memory_growth, quantile, values

__all__ = ["SCHEMA", "plot", "summary_row"]


def summary_row(e: dict[str, Any]) -> dict[str, Any]:
    """One size's headline numbers (printed while the benchmark runs)."""
    return {"N": e["world_size"],
            "supervisor_cpu": round(e["steady"]["supervisor_cpu_core_fraction"], 3),
            "rss_mb": round(e["steady"]["supervisor_rss_mb"]),
            "dead_p99_s": quantile(values(e["dead_rank"], "detect_s"), 0.99),
            "hung_p99_s": quantile(values(e["hung_rank"], "detect_s"), 0.99),
            "node_p99_s": quantile(values(e["lost_node"], "detect_s"), 0.99),
            "memory": memory_growth(e.get("memory"))}


def plot(doc: dict[str, Any], path: str) -> None:
    """Six panels against N (log scale): CPU, RSS, message rate, detection, launch, rounds."""
    import matplotlib  # noqa: PLC0415 - only to draw

    matplotlib.use("Agg")
    from matplotlib.figure import Figure  # noqa: PLC0415 - only to draw

    sizes = doc["sizes"]
    if not sizes:
        return
    n = [e["world_size"] for e in sizes]
    fig = Figure(figsize=(13, 7.5))
    axes = fig.subplots(2, 3).ravel()

    def panel(ax: Any, title: str, series: dict[str, list[float | None]], unit: str) -> None:
        for label, ys in series.items():
            pts = [(x, y) for x, y in zip(n, ys, strict=True) if y is not None]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_title(title)
        ax.set_xlabel("simulated ranks (N)")
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend(fontsize=8)

    def q(key: str, field: str, p: float) -> list[float | None]:
        return [quantile(values(e[key], field), p) for e in sizes]

    panel(axes[0], "supervisor CPU", {"steady": [100 * e["steady"]["supervisor_cpu_core_fraction"]
                                                 for e in sizes]}, "% of a core")
    panel(axes[1], "supervisor RSS", {"steady": [e["steady"]["supervisor_rss_mb"]
                                                 for e in sizes]}, "MB")
    panel(axes[2], "messages into the supervisor",
          {"batches/s": [e["steady"]["batches_per_s"] for e in sizes],
           "reports/s (inside batches)": [e["steady"]["reports_per_s"] for e in sizes]}, "per s")
    panel(axes[3], "detection p99", {"dead rank": q("dead_rank", "detect_s", 0.99),
                                     "hung rank": q("hung_rank", "detect_s", 0.99),
                                     "lost node": q("lost_node", "detect_s", 0.99)}, "s")
    panel(axes[4], "decide + launch recovery",
          {"p50": [quantile(values(e["dead_rank"] + e["hung_rank"], "launch_s"), 0.5)
                   for e in sizes],
           "p99": [quantile(values(e["dead_rank"] + e["hung_rank"], "launch_s"), 0.99)
                   for e in sizes]}, "s")
    panel(axes[5], "save round (median)",
          {mode: [quantile(e["save_rounds"][mode]["round_s"], 0.5) for e in sizes]
           for mode in ("per_rank", "per_node")}, "s")
    fig.suptitle(f"Control plane against N ({doc['ranks_per_node']} ranks per node"
                 f"{', quick run' if doc['quick'] else ''})")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
