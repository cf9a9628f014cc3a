"""Recovery mechanisms for `jobs/bench/bench_recovery.py`, one module each.

Every mechanism trains the same `harness.spec.Workload`, logs the same events (or, for ours,
records the same `RunTimeline` in its supervisor), and is scored with one yardstick. Modules are
imported lazily: a mechanism's software (Ray Train, NVRx, torchft) is only needed when it runs.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Mechanism name -> (module, class, constructor kwargs). The order is the tables' order.
MECHANISMS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "ours": ("ours_peer", "OursPeer", {"variant": "default"}),
    "ours-spare": ("ours_peer", "OursPeer", {"variant": "spare"}),
    "ours-all": ("ours_peer", "OursPeer", {"variant": "all"}),
    "ours-replica": ("ours_peer", "OursPeer", {"variant": "replica"}),
    "torchrun": ("torchrun_peer", "TorchrunPeer", {}),
    "ft-launcher": ("nvrx_peer", "NvrxPeer", {}),
    "ray-train": ("ray_train_peer", "RayTrainPeer", {}),
    "ray-train-torchft": ("ray_torchft_peer", "RayTorchftPeer", {}),
    "torchft": ("torchft_peer", "TorchftPeer", {"durable": False}),
    "torchft-ckpt": ("torchft_peer", "TorchftPeer", {"durable": True}),
    "nvrx-inprocess": ("nvrx_inprocess_peer", "NvrxInprocessPeer", {}),
    "ours-disabled": ("ours_peer", "OursPeer", {"variant": "disabled"}),
    "ours-nockpt": ("ours_peer", "OursPeer", {"variant": "nockpt"}),
    "ours-nolocal": ("ours_peer", "OursPeer", {"variant": "nolocal"}),
    "torchrun-dcp": ("torchrun_peer", "TorchrunPeer", {"name": "torchrun-dcp"}),
}
#: The overhead benchmark's split arms (`ours-disabled` recovers from nothing, `ours-nockpt`
#: saves nothing, `ours-nolocal` keeps no local tier, `torchrun-dcp` is torchrun whose arm in
#: that benchmark saves with DCP async only, the same steps as `ours-nolocal`).
OVERHEAD_ONLY = ("ours-disabled", "ours-nockpt", "ours-nolocal", "torchrun-dcp")
#: Run only where named: ours with a memory replica, a node-loss variant (see ours_peer).
NAMED_ONLY = ("ours-replica",)
#: What the recovery sweep runs by default: every mechanism but the overhead-only arms and
#: those run only where named.
SWEPT = tuple(m for m in MECHANISMS if m not in OVERHEAD_ONLY + NAMED_ONLY)
#: Mechanisms that train the same FSDP-sharded model with the same optimizer, world size and
#: data: their final parameters must be bit-equal to each other's fault-free ones.
FSDP_FAMILY = ("ours", "ours-spare", "ours-all", "ours-replica", "torchrun", "ft-launcher",
               "ray-train", "torchrun-dcp")
#: Replicated-model mechanisms (torchft's replica groups): bit-equal to each other fault-free.
REPLICA_FAMILY = ("torchft", "torchft-ckpt", "ray-train-torchft")
#: Mechanisms whose faulty runs are not expected to equal a fault-free run (see torchft_peer).
NOT_BIT_COMPARABLE = REPLICA_FAMILY


class Missing:
    """A mechanism whose software is not installed here: listed, never run."""

    supported_kinds: frozenset = frozenset()
    num_spares, uses_durable, local_tier, config = 0, False, False, "not installed"

    def __init__(self, name: str, reason: str) -> None:
        self.name, self.reason = name, reason

    def available(self) -> str:
        return self.reason


def make_peer(name: str, **options: Any) -> Any:
    """Instantiate the mechanism called `name` (see MECHANISMS); `options` e.g. timeout_s."""
    if name not in MECHANISMS:
        raise ValueError(f"mechanism={name!r} is unknown; choose from {', '.join(MECHANISMS)}.")
    module_name, class_name, kwargs = MECHANISMS[name]
    try:
        module = importlib.import_module(f"{__name__}.{module_name}")
    except ImportError as exc:  # its software (Ray Train, torchft, NVRx) is missing here
        return Missing(name, f"not installed: {exc}")
    return getattr(module, class_name)(**kwargs, **options)


def family(name: str) -> str | None:
    """"fsdp" or "replicated": which mechanisms' math is identical to `name`'s."""
    if name in FSDP_FAMILY:
        return "fsdp"
    return "replicated" if name in REPLICA_FAMILY else None
