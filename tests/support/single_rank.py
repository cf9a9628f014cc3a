"""A committed single-rank checkpoint written the way a writer and the coordinator write one,
without actors."""

from __future__ import annotations

import time

import torch

from ray_resilience._internal.checkpoint.format import layout
from ray_resilience._internal.checkpoint.format.commit import commit_step
from ray_resilience._internal.checkpoint.format.dcp_metadata import build_metadata, dumps_metadata
from ray_resilience._internal.checkpoint.format.extra_codec import encode_extra
from ray_resilience._internal.checkpoint.format.shard_io import write_shard
from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage
from ray_resilience._internal.checkpoint.rank.snapshot import StagingBuffers, capture, state_dict_of
from ray_resilience._internal.checkpoint.wire import SaveTicket

SESSION = "0123456789abcdef"


def write_single_rank(storage: CheckpointStorage, model, optimizer, step: int,
                      extra: dict, *, direct: bool = False) -> layout.StepDir:
    """The writer and coordinator steps for one rank, without actors."""
    state = capture(model, optimizer)
    items, planner_data = state.build_items()
    tensors, blobs = state.sources(items)
    buffers = StagingBuffers(items, tensors)
    buffers.copy_now(tensors, list(range(len(tensors))))
    ticket = SaveTicket(SESSION, step, 0, 1, items, [True] * len(items), planner_data, time.time())
    payload = buffers.payload(blobs, encode_extra(extra))
    files, written, infos = write_shard(storage, ticket, payload, direct=direct)
    step_dir = layout.StepDir(step, SESSION)
    metadata = build_metadata([(written, infos)], planner_data=planner_data,
                              checkpoint_id=storage.display(step_dir.name), save_id=step_dir.name)
    commit_step(storage, step_dir, world_size=1, metadata=dumps_metadata(metadata), files=files)
    return step_dir


def flat_state(model, optimizer) -> dict[str, torch.Tensor]:
    """Every tensor of the model's and the optimizer's state, by one flat name."""
    state = state_dict_of(model, optimizer)
    out = {f"m.{k}": v for k, v in state["model"].items()}
    for fqn, entry in state["optimizer"]["state"].items():
        out.update({f"o.{fqn}.{k}": v for k, v in entry.items()})
    return out
