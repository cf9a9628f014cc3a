"""Goodput accounting: `RunTimeline` records a run, `compute_goodput` turns it into a
`GoodputReport`; `table` and `plot` render it.
"""

from ray_resilience.goodput.report import FaultRecovery, GoodputReport, compute_goodput
from ray_resilience.goodput.timeline import RunTimeline

__all__ = ["compute_goodput", "FaultRecovery", "GoodputReport", "RunTimeline"]
