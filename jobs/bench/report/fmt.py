"""Number formatting and Markdown tables: deterministic, so a re-render is byte-identical."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

NONE = "–"


def pct(x: float | None, digits: int = 1) -> str:
    return NONE if x is None else f"{100 * x:.{digits}f}%"


def sec(x: float | None) -> str:
    if x is None:
        return NONE
    return f"{x:.2f} s" if x < 10 else f"{x:.1f} s"


def ms(x: float | None) -> str:
    if x is None:
        return NONE
    return f"{1000 * x:.1f} ms" if x < 1 else f"{1000 * x:.0f} ms"


def mb(x: float | None) -> str:
    """Megabytes: whole above 10, three significant digits below."""
    if x is None:
        return NONE
    return f"{x:.0f} MB" if x >= 10 else f"{x:.3g} MB"


def num(x: float | None, digits: int = 0) -> str:
    return NONE if x is None else f"{x:.{digits}f}"


def gib(x: float | None) -> str:
    return NONE if x is None else f"{x / 2**30:.2f} GiB"


def spread(s: dict[str, Any] | None, one: Any = pct) -> str:
    """A repetition summary as "median (min–max)", or just the median of a single run."""
    if not s or s.get("median") is None:
        return NONE
    if s.get("n", 1) <= 1 or s["min"] == s["max"]:
        return one(s["median"])
    return f"{one(s['median'])} ({one(s['min'])}–{one(s['max'])})"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub Markdown table; the first column is left-aligned, the rest right-aligned."""
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"
    align = ["---"] + ["---:"] * (len(headers) - 1)
    return "\n".join([line(headers), line(align), *(line(r) for r in rows)])
