"""Peer recovery mechanisms for `jobs/bench/bench_recovery.py`, one module each.

Every peer trains the same `Workload` (spec.py) with the shared loop (workload.py), logs the same
events (events.py), and is converted into the same `RunTimeline` (timeline.py), so
`compute_goodput` applies one definition to all of them. Modules are imported lazily: a peer's
software (Ray Train, NVRx) is only needed when that peer runs.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Mechanism name -> (module, class, constructor kwargs). The order is the table's order.
MECHANISMS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "ours-inprocess": ("ours_peer", "OursPeer", {"variant": "inprocess"}),
    "ours-replace-failed": ("ours_peer", "OursPeer", {"variant": "replace-failed"}),
    "ours-replace-failed-spare": ("ours_peer", "OursPeer", {"variant": "replace-failed-spare"}),
    "ours-replace-failed-2spares": ("ours_peer", "OursPeer", {"variant": "replace-failed-2spares"}),
    "ours-all": ("ours_peer", "OursPeer", {"variant": "all"}),
    "ray-train": ("ray_train_peer", "RayTrainPeer", {}),
    "nvrx-ft-launcher": ("nvrx_peer", "NvrxPeer", {}),
    "torchrun": ("torchrun_peer", "TorchrunPeer", {}),
    "torchft": ("torchft_peer", "TorchftPeer", {}),
}


def make_peer(name: str, **options: Any) -> Any:
    """Instantiate the peer called `name` (see MECHANISMS); `options` e.g. timeout_s."""
    if name not in MECHANISMS:
        raise ValueError(f"mechanism={name!r} is unknown; choose from {', '.join(MECHANISMS)}.")
    module_name, class_name, kwargs = MECHANISMS[name]
    module = importlib.import_module(f"{__name__}.{module_name}")
    return getattr(module, class_name)(**kwargs, **options)
