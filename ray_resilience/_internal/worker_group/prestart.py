"""Bare Ray worker processes kept booted on the ranks' nodes, so a respawn skips the boot.

A rank respawned without a warm spare gets a new actor, and a new actor gets a new Python
process: the raylet forks it and it imports Ray and connects before our code runs (0.6-0.8 s
here, 2.0-2.4 s on a loaded 2-core node). The raylet hands an actor an idle worker of the same
job and runtime env when it has one (measured here: first call 0.16-0.23 s after creation
instead of 0.6-0.8 s), but it prestarts workers only when the first driver connects. Ray's
raylet has an RPC that starts such workers on demand with a keep-alive (`PrestartWorkers`, the
one Ray's own libraries use) and no public Python API, so this module calls it through Ray's
gRPC helpers (which add the cluster's auth token and TLS).

These are not warm spares: a prestarted worker holds no resources and no rank state. It is
asked for with the rank actors' own runtime env, so only a rank actor of this run takes it;
that env carries a setup hook that has the process import torch and the rest at idle CPU
priority while it waits (`preimport.py`). Anything
that fails here is logged once and turns the feature off for the run: it only saves time.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import ray

from ray_resilience._internal.constants import (
    DEFAULT_PRESTART_KEEP_ALIVE_S,
    DEFAULT_PRESTART_RPC_TIMEOUT_S,
    PRESTART_KEEP_ALIVE_ENV_VAR,
    PRESTART_RPC_TIMEOUT_ENV_VAR,
    env_float,
)

log = logging.getLogger(__name__)



class WorkerPrestarter:
    """Asks the raylets of given nodes to keep `count` idle workers of this job booted."""

    def __init__(self, count: int, *, enabled: bool = True) -> None:
        self.count = count
        self.enabled = enabled and count > 0
        self.requested: dict[str, int] = {}
        """Node id -> workers asked for over the run (tests and stats)."""

    def request(self, nodes: Iterable[str] | Mapping[str, int],
                runtime_env: str | None = None) -> list[str]:
        """Asks each node's raylet for workers with `runtime_env` (serialized as the raylet keys
        workers by; None: the job's): `count` each for a list of nodes, or the number a
        mapping gives. Returns the nodes asked. Never raises."""
        wanted = dict(nodes) if isinstance(nodes, Mapping) else dict.fromkeys(nodes, self.count)
        wanted = {node: n for node, n in sorted(wanted.items()) if n > 0}
        if not self.enabled or not wanted:
            return []
        try:
            self._send(wanted, runtime_env)
        except Exception as exc:  # noqa: BLE001 - an optimization: respawns just boot normally
            self.enabled = False
            log.warning("could not ask Ray to prestart worker processes (%s: %s); respawned ranks "
                        "will boot a new process (set InJobConfig.num_prestarted_workers=0 to "
                        "not try)", type(exc).__name__, exc)
            return []
        for node, n in wanted.items():
            self.requested[node] = self.requested.get(node, 0) + n
        return list(wanted)

    def _send(self, wanted: dict[str, int], runtime_env: str | None = None) -> None:
        # Ray-private modules, loaded only when workers are asked for.
        from ray._private.grpc_utils import init_grpc_channel  # noqa: PLC0415 - see above
        from ray.core.generated import (  # noqa: PLC0415 - see above
            common_pb2,
            node_manager_pb2,
            node_manager_pb2_grpc,
        )

        worker = ray._private.worker.global_worker
        job_config = worker.core_worker.get_job_config()
        env_info = type(job_config.runtime_env_info)()
        env_info.CopyFrom(job_config.runtime_env_info)
        if runtime_env is not None:
            env_info.serialized_runtime_env = runtime_env
        job_id = ray.get_runtime_context().get_job_id()
        raylets = {n["NodeID"]: f"{n['NodeManagerAddress']}:{n['NodeManagerPort']}"
                   for n in ray.nodes() if n.get("Alive")}
        keep_alive_s = int(env_float(PRESTART_KEEP_ALIVE_ENV_VAR, DEFAULT_PRESTART_KEEP_ALIVE_S))
        rpc_timeout_s = env_float(PRESTART_RPC_TIMEOUT_ENV_VAR, DEFAULT_PRESTART_RPC_TIMEOUT_S)
        for node, count in wanted.items():
            if node not in raylets:
                continue  # gone: its bundles are being placed elsewhere
            channel = init_grpc_channel(raylets[node])
            try:
                node_manager_pb2_grpc.NodeManagerServiceStub(channel).PrestartWorkers(
                    node_manager_pb2.PrestartWorkersRequest(
                        language=common_pb2.PYTHON, job_id=bytes.fromhex(job_id),
                        runtime_env_info=env_info,
                        keep_alive_duration_secs=keep_alive_s, num_workers=count),
                    timeout=rpc_timeout_s)
            finally:
                channel.close()
