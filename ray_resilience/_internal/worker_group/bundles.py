"""Where ranks run: placement-group bundles (bundle i hosts rank i), their nodes, and new bundles
outside excluded nodes (a `ray.io/node-id` label selector).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

from ray_resilience._internal.constants import (
    DEFAULT_SLOW_WAIT_WARNING_S,
    SLOW_WAIT_WARNING_ENV_VAR,
    env_float,
)
from ray_resilience.config import ScalingConfig
from ray_resilience.errors import InsufficientResourcesError

log = logging.getLogger(__name__)
NODE_ID_LABEL = "ray.io/node-id"


@dataclasses.dataclass(frozen=True)
class Bundle:
    """One bundle of one of the run's placement groups."""

    pg: Any
    index: int


class Bundles:
    """The run's placement groups and the nodes their bundles landed on."""

    def __init__(self, scaling: ScalingConfig) -> None:
        self.scaling = scaling
        self.groups: list[Any] = []
        self._nodes: dict[tuple[Any, int], str] = {}

    def reserve(self, count: int, timeout_s: float) -> list[Bundle]:
        """The run's first placement group of `count` bundles; raises naming
        `ResilienceConfig.placement_timeout_s` when it is not placed in time."""
        pg = placement_group([self.scaling.bundle] * count,
                             strategy=self.scaling.placement_strategy)
        if not self._wait(pg, timeout_s, f"{count} ranks"):
            asked = {k: v * count for k, v in self.scaling.bundle.items()}
            raise InsufficientResourcesError(
                "ResilienceConfig.placement_timeout_s", timeout_s, asked, ray.available_resources(),
                "The placement group for the ranks was not ready in time: free resources, "
                "add nodes or raise placement_timeout_s.")
        return self._adopt(pg, count)

    def elsewhere(self, count: int, exclude: set[str], timeout_s: float) -> list[Bundle] | None:
        """`count` new bundles on nodes outside `exclude`; None when there is no room in time."""
        selector = {NODE_ID_LABEL: f"!in({','.join(sorted(exclude))})"}
        pg = placement_group([self.scaling.bundle] * count,
                             strategy=self.scaling.placement_strategy,
                             bundle_label_selector=[selector] * count)
        if not self._wait(pg, timeout_s, f"{count} ranks away from nodes {sorted(exclude)}"):
            return None
        return self._adopt(pg, count)

    def node_of(self, bundle: Bundle) -> str | None:
        return self._nodes.get((bundle.pg.id, bundle.index))

    def placed_node(self, bundle: Bundle) -> str | None:
        """Where Ray has `bundle` now, from the GCS (a bundle of a lost node is placed again on
        another node); None while it is not placed or the GCS does not answer."""
        try:
            table = placement_group_table(bundle.pg)["bundles_to_node_id"]
        except Exception:  # noqa: BLE001 - asked again at the next poll
            return None
        node = table.get(bundle.index) or None
        if node is not None:
            self._nodes[(bundle.pg.id, bundle.index)] = node
        return node

    def remove_all(self) -> None:
        for pg in self.groups:
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001 - already gone with the cluster
                pass
        self.groups, self._nodes = [], {}

    def _adopt(self, pg: Any, count: int) -> list[Bundle]:
        self.groups.append(pg)
        table = placement_group_table(pg)["bundles_to_node_id"]
        for index in range(count):
            self._nodes[(pg.id, index)] = table[index]
        return [Bundle(pg, index) for index in range(count)]

    def _wait(self, pg: Any, timeout_s: float, what: str) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            warn_s = env_float(SLOW_WAIT_WARNING_ENV_VAR, DEFAULT_SLOW_WAIT_WARNING_S)
            ready, _ = ray.wait([pg.ready()], timeout=max(0.01, min(warn_s, left)))
            if ready:
                return True
            if time.monotonic() >= deadline:
                remove_placement_group(pg)
                return False
            log.warning("waiting for resources for %s (%s each); available now: %s", what,
                        self.scaling.bundle, ray.available_resources())
