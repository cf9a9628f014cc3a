"""`CheckpointConfig`: how often to save, what to do with saves in flight, what to keep."""

from __future__ import annotations

import dataclasses
import os
from typing import Literal

from ray_resilience import _validate as check
from ray_resilience.errors import ConfigError

InFlightPolicy = Literal["coalesce", "skip", "block"]
IN_FLIGHT_POLICIES: tuple[str, ...] = ("coalesce", "skip", "block")
SnapshotMode = Literal["auto", "overlap", "sync"]
SNAPSHOT_MODES: tuple[str, ...] = ("auto", "overlap", "sync")
WriterPriority = Literal["auto", "background", "low", "inherit"]
WRITER_PRIORITIES: tuple[str, ...] = ("auto", "background", "low", "inherit")
AUTO = "auto"


@dataclasses.dataclass(kw_only=True)
class CheckpointConfig:
    """Async checkpoints through node-local writer actors. Validated on construction."""

    interval_steps: int = 0
    """Save when `step % interval_steps == 0` (0: no periodic saves)."""
    in_flight_policy: InFlightPolicy = "coalesce"
    """A save arriving while the previous one is not durable: "coalesce" keeps the newest
    (never blocks), "skip" drops it, "block" waits (NVRx's behaviour)."""
    num_to_keep: int = 2
    """Newest committed checkpoints kept in storage (at least 2)."""
    memory_tier: bool = True
    """Keep the newest committed checkpoint in writer memory: restarts skip reading storage."""
    memory_budget_bytes: int | None = None
    """Per-node cap on the memory tier, replicas included, held in the writers' shared memory
    (None: the node's object store size)."""
    memory_replicas: int = 0
    """Copies of each rank's newest committed shard kept by other writers (other nodes first),
    so a rank whose node or writer was lost restores from memory."""
    snapshot: SnapshotMode = "auto"
    """"overlap": copy parameters and optimizer state during the next forward/backward; "sync":
    before `report` returns; "auto": sync below `auto_sync_max_bytes`, else overlap."""
    auto_sync_max_bytes: int = 128 * 2**10
    """Under `snapshot="auto"`: a rank state smaller than this is copied before `save` returns."""
    local_interval_steps: int | Literal["auto"] = AUTO
    """Also write each rank's state to node-local shared memory every this many steps (0: off);
    a restart on the same node then redoes at most this many steps. "auto": the shortest
    interval whose measured cost stays within `local_overhead_budget` (`Result.local_interval_steps`
    reports it)."""
    local_overhead_budget: float = 0.01
    """Under "auto": the local tier's share of step time it may cost (copies, checksum, writes)."""
    local_dir: str = "/dev/shm"
    """Node-local tmpfs for the local tier (on Kubernetes: an `emptyDir` with medium Memory)."""
    local_max_bytes: int | None = None
    """A rank whose state is larger skips the local tier (None: only the tmpfs capacity check)."""
    replica_bytes_per_s: float | None = 2**30
    """Pace of replica copies into each writer, in bytes per second (None: unpaced), so they
    leave training's network and memory bandwidth alone."""
    writers_per_node: int = 1
    """Writer actors per node hosting ranks; ranks on a node are spread across them."""
    writer_priority: WriterPriority = "auto"
    """CPU priority of the writers' threads: "background" (SCHED_BATCH 11 nice levels below the
    ranks, about a twelfth of a core against a busy rank; SCHED_IDLE where that passes 19),
    "low" (nice 19), "inherit" (the ranks'); "auto": background, but inherit under
    `in_flight_policy="block"`. Ranks and writers start at nice 0 unless the job's runtime env
    sets `RAY_worker_niceness`."""

    direct_io: bool = True
    """Write data files on a local or shared POSIX file system (FSx for Lustre, EBS, NVMe) with
    O_DIRECT, and restore their large tensors with O_DIRECT straight into the model, bypassing
    the node's page cache (buffered where the file system refuses it, and on S3); False:
    buffered, each written file's pages dropped after its fsync."""

    num_storage_retries: int = 3
    """Retries of a failed storage write (S3 outage, network) before the save is given up."""
    storage_retry_backoff_s: float = 1.0
    """Wait before the first retry; doubles with every further retry."""
    storage_retry_max_backoff_s: float = 30.0
    """Cap on the wait between two retries."""
    write_timeout_s: float = 1800.0
    """Longest a rank waits for its writer to make a shard durable before giving it up."""
    collective_timeout_s: float = 600.0
    """Timeout of the CPU (gloo) group for checkpoint agreement when the backend is not gloo."""
    warn_interval_s: float = 30.0
    """Every wait logs what it is still waiting for at this period."""
    lease_ttl_s: float = 60.0
    """Life of the run's lease (one job writes a run): renewed 5 times per life; a crashed
    job's run can be taken over this long after its last renewal."""
    lease_wait_s: float = 0.0
    """How long a job waits for another job of the same run name to end (0: fail at once)."""

    @property
    def writer_priority_now(self) -> str:
        """`writer_priority` with "auto" resolved."""
        if self.writer_priority != "auto":
            return self.writer_priority
        return "inherit" if self.in_flight_policy == "block" else "background"

    def overlaps_copy(self, tensor_bytes: int, *, has_optimizer: bool) -> bool:
        """Whether a save of a rank holding `tensor_bytes` copies them after `save` returns."""
        if not has_optimizer or self.snapshot == "sync":
            return False
        return self.snapshot == "overlap" or tensor_bytes >= self.auto_sync_max_bytes

    def __post_init__(self) -> None:
        self._check_int("interval_steps", minimum=0, fix="use 0 to turn periodic saves off.")
        self._check_choice("in_flight_policy", IN_FLIGHT_POLICIES, "'coalesce' never blocks "
                                                                   "training.")
        self._check_choice("snapshot", SNAPSHOT_MODES, "'sync' if the loop changes parameters "
                           "outside optimizer.step() between report() and the next step.")
        self._check_int("num_to_keep", minimum=2,
                        fix="keep at least 2 so a crash while writing leaves one loadable "
                            "checkpoint.")
        self._check_int("writers_per_node", minimum=1, fix="use at least 1 writer per node.")
        self._check_choice("writer_priority", WRITER_PRIORITIES, "'auto' writes on CPU time "
                           "training leaves idle unless in_flight_policy='block'.")
        self._check_int("auto_sync_max_bytes", minimum=0,
                        fix="give a byte count (0: always overlap under snapshot='auto').")
        self._check_int("num_storage_retries", minimum=0, fix="use 0 to never retry.")
        if self.local_interval_steps != AUTO:
            self._check_int("local_interval_steps", minimum=0,
                            fix="use 'auto', or 0 to turn the local tier off.")
        budget = self.local_overhead_budget
        if not isinstance(budget, (int, float)) or isinstance(budget, bool) \
                or not 0 < budget <= 1:
            raise ConfigError("CheckpointConfig.local_overhead_budget", budget,
                              "must be a fraction of step time in (0, 1], e.g. 0.01 for 1%.")
        pace = self.replica_bytes_per_s
        if pace is not None and (not isinstance(pace, (int, float)) or isinstance(pace, bool)
                                 or not pace > 0 or pace == float("inf")):
            raise ConfigError("CheckpointConfig.replica_bytes_per_s", pace,
                              "must be a byte rate > 0, or None for unpaced replica copies.")
        if self.local_max_bytes is not None:
            self._check_int("local_max_bytes", minimum=0,
                            fix="give a byte count, or None for no cap (local_interval_steps=0 "
                                "turns the tier off).")
        if self.local_interval_steps and (not isinstance(self.local_dir, str)
                                          or not os.path.isabs(self.local_dir)):
            raise ConfigError("CheckpointConfig.local_dir", self.local_dir,
                              "must be an absolute path of a node-local tmpfs folder, e.g. "
                              "'/dev/shm' (or set local_interval_steps=0).")
        check.boolean("CheckpointConfig.memory_tier", self.memory_tier)
        check.boolean("CheckpointConfig.direct_io", self.direct_io)
        self._check_int("memory_replicas", minimum=0, fix="use 0 for no replicas.")
        if self.memory_replicas and not self.memory_tier:
            raise ConfigError("CheckpointConfig.memory_replicas", self.memory_replicas,
                              "replicates the memory tier, which memory_tier=False turns off; "
                              "set memory_tier=True or memory_replicas=0.")
        if self.memory_budget_bytes is not None:
            self._check_int("memory_budget_bytes", minimum=0,
                            fix="give a byte count, or None for no cap (memory_tier=False turns "
                                "it off).")
        for name in ("storage_retry_backoff_s", "storage_retry_max_backoff_s", "write_timeout_s",
                     "collective_timeout_s", "warn_interval_s", "lease_ttl_s"):
            check.seconds(f"CheckpointConfig.{name}", getattr(self, name))
        check.seconds("CheckpointConfig.lease_wait_s", self.lease_wait_s, minimum=0,
                      fix="0: fail at once when another job holds the run.")
        self._check_order()

    def _check_order(self) -> None:
        if self.warn_interval_s >= self.write_timeout_s:
            raise ConfigError("CheckpointConfig.warn_interval_s", self.warn_interval_s,
                              f"must be shorter than write_timeout_s={self.write_timeout_s}, "
                              "otherwise a stuck write is given up before anyone is warned.")
        if self.storage_retry_backoff_s > self.storage_retry_max_backoff_s:
            raise ConfigError("CheckpointConfig.storage_retry_backoff_s",
                              self.storage_retry_backoff_s,
                              f"must be <= storage_retry_max_backoff_s="
                              f"{self.storage_retry_max_backoff_s}, the cap on every wait.")

    def _check_int(self, name: str, *, minimum: int, fix: str) -> None:
        check.integer(f"CheckpointConfig.{name}", getattr(self, name), minimum=minimum, fix=fix)

    def _check_choice(self, name: str, choices: tuple[str, ...], fix: str) -> None:
        check.choice(f"CheckpointConfig.{name}", getattr(self, name), choices, fix=fix)

    @property
    def local_tier_on(self) -> bool:
        """Whether ranks write the local tier at all ("auto" or a positive interval)."""
        return self.local_interval_steps == AUTO or self.local_interval_steps > 0

    def is_save_step(self, step: int) -> bool:
        """True when `maybe_save` saves at `step`."""
        return self.interval_steps > 0 and step % self.interval_steps == 0
