"""The rows of a materialized Ray Dataset from one row on, built without a Ray task.

`Dataset.split_at_indices` slices the boundary block in a task that needs a free CPU; on a
cluster whose CPUs the ranks hold (a laptop, a CI machine) it would wait forever. Here whole
blocks are reused by reference and only the first block's tail is copied, in the rank. Ray Data
has no public constructor from existing block references, so this mirrors what
`Dataset.materialize()` builds (Ray 2.60 internals; `shard.py` falls back to `split_at_indices`
if they move).
"""

from __future__ import annotations

from typing import Any

import ray
from ray.data._internal.execution.interfaces.ref_bundle import BlockEntry, RefBundle
from ray.data._internal.logical.interfaces import LogicalPlan
from ray.data._internal.logical.operators.input_data_operator import InputData
from ray.data.block import BlockAccessor
from ray.data.dataset import MaterializedDataset


def rows_from(dataset: Any, row: int) -> Any:
    """`dataset` (materialized) without its first `row` rows."""
    bundles, start = [], 0
    for bundle in dataset.iter_internal_ref_bundles():
        for entry in bundle.blocks:
            num_rows = entry.metadata.num_rows
            end, begin = start + num_rows, start
            start = end
            if end <= row:
                continue
            if begin < row:  # the block the row falls in: keep its tail
                tail = BlockAccessor.for_block(ray.get(entry.ref)).slice(row - begin, num_rows,
                                                                          copy=True)
                entry = BlockEntry(ref=ray.put(tail),
                                   metadata=BlockAccessor.for_block(tail).get_metadata())
            bundles.append(RefBundle(blocks=[entry], owns_blocks=False, schema=bundle.schema))
    plan = LogicalPlan(InputData(input_data=bundles), dataset.context)
    return MaterializedDataset(plan, dataset.context, dataset._raw_stats())
