"""Timing knobs and names in one place (FOO_ENV_VAR / DEFAULT_FOO pairs).

The driver forwards these environment variables to the supervisor and workers, so tests can
shrink them without touching configs.
"""

from __future__ import annotations

import os

SUPERVISOR_NAME_PREFIX = "ray_resilience:supervisor:"
"""Named supervisor actor per run; a second driver with the same run name finds the first."""

WORKER_MAX_CONCURRENCY = 8
"""Worker actors are threaded: the train loop runs in its own thread while control calls run."""

SUPERVISOR_MAX_CONCURRENCY = 32

SHUTDOWN_TIMEOUT_ENV_VAR = "RAY_RESILIENCE_SHUTDOWN_TIMEOUT_S"
DEFAULT_SHUTDOWN_TIMEOUT_S = 10.0
"""How long teardown waits for workers to destroy their process groups before killing them."""

ALLOW_PENDING_RESOURCES_ENV_VAR = "RAY_RESILIENCE_ALLOW_PENDING_RESOURCES"
"""Set to 1 on autoscaling clusters: skip the fail-fast check that the cluster can host the run."""

SLOW_WAIT_WARNING_S = 10.0
"""Every wait logs who it is still waiting for at this period."""

FORWARDED_ENV_VARS = (SHUTDOWN_TIMEOUT_ENV_VAR, ALLOW_PENDING_RESOURCES_ENV_VAR)


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} must be a number") from None


def forwarded_env() -> dict[str, str]:
    return {k: os.environ[k] for k in FORWARDED_ENV_VARS if k in os.environ}
