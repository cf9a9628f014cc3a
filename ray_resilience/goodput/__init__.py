"""Goodput accounting: one definition for every recovery mechanism, computed from a run timeline.

`RunTimeline` records what happened when; `compute_goodput` turns it into a `GoodputReport`
(training and infra goodput, recovery per fault); `table` and `plot` render it.
"""

from ray_resilience.goodput.report import FaultRecovery, GoodputReport, compute_goodput
from ray_resilience.goodput.timeline import RunTimeline

__all__ = ["compute_goodput", "FaultRecovery", "GoodputReport", "RunTimeline"]
