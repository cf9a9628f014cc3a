"""Per-rank health checks, run inside the worker before it is trusted with a new attempt."""

from __future__ import annotations

import torch


def cuda_health(device_index: int = 0) -> str | None:
    """None if the GPU answers (a sync and a tiny kernel read back), else why: a broken
    context (Xid, sticky CUDA error) sends the rank to a fresh process."""
    if not torch.cuda.is_available():
        return "CUDA is not available in this process"
    try:
        with torch.cuda.device(device_index):
            torch.cuda.synchronize()
            probe = torch.ones(16, device="cuda")
            if float((probe * 2).sum().item()) != 32.0:
                return "a probe kernel returned a wrong result"
            torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - any CUDA error means unhealthy
        return f"{type(exc).__name__}: {exc}"
    return None
