"""Bare Ray worker processes kept booted on the ranks' nodes, so a respawn skips the boot.

Calls the raylet's `PrestartWorkers` RPC (no public Python API) through Ray's gRPC helpers, with
the rank actors' runtime env, so only rank actors take them (docs/design.md, section 6). A
failure is logged once and turns the feature off for the run.
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
        """Asks each node's raylet for workers with `runtime_env` (None: the job's): `count` per
        listed node, or the number a mapping gives. Returns the nodes asked; never raises."""
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
