"""Where a respawned rank's new actor lands, announced while it starts (`WorkerGroup.replace`'s
`on_node`): the supervisor starts that node's checkpoint writers beside the rank's own start-up
instead of after it. Fake bundles, no Ray."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from ray_resilience._internal.worker_group.group import WorkerGroup

pytestmark = pytest.mark.timeout(30)


class _Placements:
    """`Bundles.placed_node` answering from a script: per bundle, one answer per poll."""

    def __init__(self, script: dict[str, list[str | None]]) -> None:
        self.script = script
        self.polls: list[str] = []

    def placed_node(self, bundle: str) -> str | None:
        self.polls.append(bundle)
        answers = self.script[bundle]
        return answers.pop(0) if len(answers) > 1 else answers[0]


def _group(script: dict[str, list[str | None]]) -> Any:
    group = object.__new__(WorkerGroup)  # only `bundles` and `bundle_of` are read
    group.bundles = _Placements(script)
    group.bundle_of = {rank: f"b{rank}" for rank in range(3)}
    return group


def test_a_rank_moving_off_a_lost_node_is_announced_once_ray_places_it_elsewhere():
    # Rank 1 ran on "lost": its bundle still names that node until the GCS declares it dead,
    # then is unplaced, then lands on "new".
    group = _group({"b1": ["lost", None, "new"]})
    moving: dict[int, str | None] = {1: "lost"}
    announced: list[str] = []
    for _ in range(2):
        group._announce_nodes(moving, announced.append)
        assert announced == [] and moving == {1: "lost"}
    group._announce_nodes(moving, announced.append)
    assert announced == ["new"] and moving == {}
    group._announce_nodes(moving, announced.append)  # nothing left to look up
    assert announced == ["new"] and group.bundles.polls == ["b1"] * 3


def test_a_rank_respawned_on_its_own_node_is_not_announced():
    # A killed process's bundle stays where it was: that node's writers already run.
    group = _group({"b0": ["same"], "b2": ["other"]})
    moving: dict[int, str | None] = {0: "same", 2: None}  # rank 2 had not started anywhere
    announced: list[str] = []
    group._announce_nodes(moving, announced.append)
    assert announced == ["other"] and moving == {0: "same"}


def test_a_failing_announcement_is_logged_and_the_repair_goes_on(caplog):
    group = _group({"b1": ["new"]})
    moving: dict[int, str | None] = {1: "lost"}

    def refuse(node: str) -> None:
        raise RuntimeError(f"no writer for {node}")

    with caplog.at_level(logging.WARNING):
        group._announce_nodes(moving, refuse)
    assert moving == {}, "a node is announced once, whatever the callback did"
    assert "could not prepare node new for rank 1" in caplog.text
    assert "no writer for new" in caplog.text
