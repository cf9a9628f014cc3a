"""The run's Ray Datasets, materialized once by the supervisor in a fixed order: every attempt
and every world size then reads the same rows in the same order (see `shard.py`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from ray_resilience._internal.data.shard import DatasetSource

log = logging.getLogger(__name__)


def materialize(datasets: Mapping[str, Any]) -> dict[str, DatasetSource]:
    """Executes each dataset with `preserve_order` (the order of its inputs, not of whichever
    read task finished first) and keeps its blocks for the whole run. Runs before the ranks'
    placement group is reserved, so the read tasks find free CPUs."""
    sources = {}
    for name, dataset in datasets.items():
        t0 = time.monotonic()
        context = dataset.context
        context.execution_options.preserve_order = True
        context.enable_progress_bars = False  # the driver shows the run's own progress
        materialized = dataset.materialize()
        num_rows = materialized.count()
        log.info("dataset %r: %d rows in %d blocks, materialized in %.1f s", name, num_rows,
                 materialized.num_blocks(), time.monotonic() - t0)
        sources[name] = DatasetSource(dataset=materialized, num_rows=num_rows)
    return sources
