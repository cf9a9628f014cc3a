"""Fail fast when the cluster can never host the run, instead of waiting forever."""

from __future__ import annotations

import os

import ray

from ray_resilience._internal.constants import ALLOW_PENDING_RESOURCES_ENV_VAR
from ray_resilience.config import ScalingConfig
from ray_resilience.errors import ConfigError, InsufficientResourcesError


def _alive_node_totals() -> list[dict[str, float]]:
    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive")]


def bundles_that_fit(bundle: dict[str, float], nodes: list[dict[str, float]]) -> int:
    """How many copies of `bundle` the nodes could host at once if they were empty."""
    total = 0
    for node in nodes:
        fits = min((int(node.get(k, 0.0) // v) for k, v in bundle.items() if v > 0), default=0)
        total += fits
    return total


def check_cluster_can_host(scaling: ScalingConfig, num_spares: int = 0) -> None:
    """Raises before any actor starts if this cluster cannot host the run (skipped with
    RAY_RESILIENCE_ALLOW_PENDING_RESOURCES=1, for autoscaling clusters)."""
    nodes = _alive_node_totals()
    totals = {k: sum(n.get(k, 0.0) for n in nodes) for n in nodes for k in n}
    if scaling.use_gpu and totals.get("GPU", 0) == 0:
        raise ConfigError("ScalingConfig.use_gpu", True,
                          "the Ray cluster has no GPUs; set use_gpu=False to train on CPU with "
                          "gloo, or connect to a cluster with GPU nodes.")
    if os.environ.get(ALLOW_PENDING_RESOURCES_ENV_VAR) == "1":
        return
    bundle = scaling.bundle
    fit = bundles_that_fit(bundle, nodes)
    if fit < scaling.num_workers + num_spares:
        asked = {k: v * (scaling.num_workers + num_spares) for k, v in bundle.items()}
        available = {k: totals.get(k, 0.0) for k in bundle}
        raise InsufficientResourcesError(
            "ScalingConfig.num_workers", scaling.num_workers, asked, available,
            f"At most {fit} workers of {bundle} fit on the current nodes ({num_spares} of those "
            f"asked for are warm spares, InJobConfig.num_spares). Lower num_workers, num_spares "
            f"or resources_per_worker, add nodes, or on an autoscaling cluster set "
            f"{ALLOW_PENDING_RESOURCES_ENV_VAR}=1.")
