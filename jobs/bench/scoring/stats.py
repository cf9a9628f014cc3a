"""Median and spread over repetitions, and percentiles."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def summary(values: Sequence[float | None]) -> dict[str, float | int | None]:
    """{"median", "min", "max", "n"} over the known values (None when there are none)."""
    known = [v for v in values if v is not None]
    if not known:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(known), "min": min(known), "max": max(known),
            "n": len(known)}


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between order statistics (numpy's default); q in 0..100."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
