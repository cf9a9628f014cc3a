"""Timing knobs and names in one place: `FOO_ENV_VAR` / `DEFAULT_FOO` pairs, read with
`env_float` where used. The driver forwards every one set in its environment to the run's actors.
"""

from __future__ import annotations

import os
import secrets
import time

SUPERVISOR_NAME_PREFIX = "ray_resilience:supervisor:"
"""Named supervisor actor per run; a second driver with the same run name finds the first."""

WORKER_MAX_CONCURRENCY = 8
"""Worker actors are threaded: the train loop runs in its own thread while control calls run."""

SUPERVISOR_MAX_CONCURRENCY = 32

ALLOW_PENDING_RESOURCES_ENV_VAR = "RAY_RESILIENCE_ALLOW_PENDING_RESOURCES"
"""Set to 1 on autoscaling clusters: skip the fail-fast check that the cluster can host the run."""


SHUTDOWN_TIMEOUT_ENV_VAR = "RAY_RESILIENCE_SHUTDOWN_TIMEOUT_S"
DEFAULT_SHUTDOWN_TIMEOUT_S = 10.0
"""How long teardown waits for workers to destroy their process groups before killing them."""

SLOW_WAIT_WARNING_ENV_VAR = "RAY_RESILIENCE_SLOW_WAIT_WARNING_S"
DEFAULT_SLOW_WAIT_WARNING_S = 10.0
"""Every wait logs who it is still waiting for at this period."""

ERROR_GRACE_ENV_VAR = "RAY_RESILIENCE_ERROR_GRACE_S"
DEFAULT_ERROR_GRACE_S = 0.05
"""After a first error, how long to wait for peers' errors, so the earliest is reported."""

HEALTH_TIMEOUT_ENV_VAR = "RAY_RESILIENCE_HEALTH_TIMEOUT_S"
DEFAULT_HEALTH_TIMEOUT_S = 10.0
"""How long a kept rank may take to answer its health check."""

SPARE_REPLENISH_MAX_DELAY_ENV_VAR = "RAY_RESILIENCE_SPARE_REPLENISH_MAX_DELAY_S"
DEFAULT_SPARE_REPLENISH_MAX_DELAY_S = 10.0
"""Longest a recovery that used warm spares holds back their replacements."""

PRESTART_KEEP_ALIVE_ENV_VAR = "RAY_RESILIENCE_PRESTART_KEEP_ALIVE_S"
DEFAULT_PRESTART_KEEP_ALIVE_S = 24 * 3600.0
"""How long the raylet keeps a prestarted worker idle before it may reclaim it."""

PRESTART_RPC_TIMEOUT_ENV_VAR = "RAY_RESILIENCE_PRESTART_RPC_TIMEOUT_S"
DEFAULT_PRESTART_RPC_TIMEOUT_S = 5.0
"""Timeout of one PrestartWorkers call to a raylet."""


PG_TIMEOUT_ENV_VAR = "RAY_RESILIENCE_PG_TIMEOUT_S"
DEFAULT_PG_TIMEOUT_S = 600.0
"""Timeout of the process groups the ranks create (a backstop: aborts end blocked calls)."""

FINAL_SAVE_TIMEOUT_ENV_VAR = "RAY_RESILIENCE_FINAL_SAVE_TIMEOUT_S"
DEFAULT_FINAL_SAVE_TIMEOUT_S = 600.0
"""How long a rank whose train function returned waits for its last save to be durable."""

STORE_PROBE_INTERVAL_ENV_VAR = "RAY_RESILIENCE_STORE_PROBE_INTERVAL_S"
DEFAULT_STORE_PROBE_INTERVAL_S = 0.005
"""How often a peer checks whether rank 0's store listens before it connects."""

PREIMPORT_WATCH_INTERVAL_ENV_VAR = "RAY_RESILIENCE_PREIMPORT_WATCH_INTERVAL_S"
DEFAULT_PREIMPORT_WATCH_INTERVAL_S = 5.0
"""How often an unclaimed prestarted process checks whether its run has ended."""


CHECKPOINT_CALL_TIMEOUT_ENV_VAR = "RAY_RESILIENCE_CHECKPOINT_CALL_TIMEOUT_S"
DEFAULT_CHECKPOINT_CALL_TIMEOUT_S = 300.0
"""Bound on one call to the commit coordinator (longer than a writer's start)."""

WRITER_POLL_ENV_VAR = "RAY_RESILIENCE_WRITER_POLL_S"
DEFAULT_WRITER_POLL_S = 2.0
"""How long one call to a writer waits for a shard's outcome before the rank asks again."""

VOTE_WAIT_ENV_VAR = "RAY_RESILIENCE_VOTE_WAIT_S"
DEFAULT_VOTE_WAIT_S = 1.0
"""How long one coordinator call waits for a round's outcome before the rank asks again."""

WRITER_START_TIMEOUT_ENV_VAR = "RAY_RESILIENCE_WRITER_START_TIMEOUT_S"
DEFAULT_WRITER_START_TIMEOUT_S = 120.0
"""How long the coordinator waits for a new writer actor to answer."""

WRITER_PING_TIMEOUT_ENV_VAR = "RAY_RESILIENCE_WRITER_PING_TIMEOUT_S"
DEFAULT_WRITER_PING_TIMEOUT_S = 10.0
"""How long a liveness or stats call to the writers may take."""

REPLICA_GET_TIMEOUT_ENV_VAR = "RAY_RESILIENCE_REPLICA_GET_TIMEOUT_S"
DEFAULT_REPLICA_GET_TIMEOUT_S = 300.0
"""How long a replica waits for the primary's copy of the shard (a cross-node transfer)."""

STALE_LOCAL_FOLDER_ENV_VAR = "RAY_RESILIENCE_STALE_LOCAL_FOLDER_S"
DEFAULT_STALE_LOCAL_FOLDER_S = 600.0
"""A local-tier run folder without a `.lock` (its writer never started) is stale after this."""

LOCAL_PROBE_STEPS_ENV_VAR = "RAY_RESILIENCE_LOCAL_PROBE_STEPS"
DEFAULT_LOCAL_PROBE_STEPS = 8.0
"""Under `local_interval_steps="auto"`: steps an attempt measures (two local writes, the rest
plain steps) before the ranks agree on the interval."""

REPLICA_CHUNK_BYTES_ENV_VAR = "RAY_RESILIENCE_REPLICA_CHUNK_BYTES"
DEFAULT_REPLICA_CHUNK_BYTES = float(64 * 2**20)
"""A replica is pulled from its source writer in chunks of this size, one at a time."""

TEST_COPY_DELAY_ENV_VAR = "RAY_RESILIENCE_TEST_SNAPSHOT_COPY_DELAY_S"
"""Tests only: each save's background copy starts this late, so what races it can be shown."""

ALLOCATOR_ENV_VARS = ("MALLOC_ARENA_MAX", "MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_",
                      "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")
"""glibc's allocator settings, read once at process start: the driver's reach the rank processes
(and teardown leaves freed memory to a process told to keep it; docs/design.md, section 8)."""

FORWARDED_ENV_VARS = (
    ALLOW_PENDING_RESOURCES_ENV_VAR, SHUTDOWN_TIMEOUT_ENV_VAR, SLOW_WAIT_WARNING_ENV_VAR,
    ERROR_GRACE_ENV_VAR, HEALTH_TIMEOUT_ENV_VAR, SPARE_REPLENISH_MAX_DELAY_ENV_VAR,
    PRESTART_KEEP_ALIVE_ENV_VAR, PRESTART_RPC_TIMEOUT_ENV_VAR, PG_TIMEOUT_ENV_VAR,
    FINAL_SAVE_TIMEOUT_ENV_VAR, STORE_PROBE_INTERVAL_ENV_VAR, PREIMPORT_WATCH_INTERVAL_ENV_VAR,
    CHECKPOINT_CALL_TIMEOUT_ENV_VAR, WRITER_POLL_ENV_VAR, VOTE_WAIT_ENV_VAR,
    WRITER_START_TIMEOUT_ENV_VAR, WRITER_PING_TIMEOUT_ENV_VAR, REPLICA_GET_TIMEOUT_ENV_VAR,
    STALE_LOCAL_FOLDER_ENV_VAR,
    LOCAL_PROBE_STEPS_ENV_VAR,
    REPLICA_CHUNK_BYTES_ENV_VAR,
    TEST_COPY_DELAY_ENV_VAR,
    *ALLOCATOR_ENV_VARS,
)


def default_run_name(prefix: str = "ray_resilience_run") -> str:
    """`RunConfig.name`'s default, new for every run (like Ray Train's `ray_train_run-<date>`):
    unrelated runs never resume each other's checkpoints."""
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} must be a number") from None


def checkpoint_call_timeout_s() -> float:
    return env_float(CHECKPOINT_CALL_TIMEOUT_ENV_VAR, DEFAULT_CHECKPOINT_CALL_TIMEOUT_S)


def forwarded_env() -> dict[str, str]:
    return {k: os.environ[k] for k in FORWARDED_ENV_VARS if k in os.environ}
