"""Shared pieces of the collective-abort scenarios (tests/support/abort_rank.py): the stand-in
supervisor, one attempt's set-up and teardown, the fault protocol, and a small FSDP2 model.

A control TCPStore (rank 0 hosts it) plays the supervisor: it exists before any process group,
like Ray's own connections, so every abort must leave it working; through it rank 0 hands out a
fresh rendezvous port per attempt. Rank 1 plays the faulty peer: it stops taking part in
collectives and waits on the control store until rank 0 has aborted.
"""

from __future__ import annotations

import datetime
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

from ray_resilience._internal.process_groups.abort import CollectiveAborter
from ray_resilience._internal.process_groups.teardown import teardown_process_groups
from ray_resilience.examples.llama import build_model, causal_lm_loss

WORLD_SIZE = 2
PG_TIMEOUT_S = 300.0  # far beyond every test timeout: a raise can only come from the abort
ABORT_DELAY_S = 1.0


class Control:
    """The harness's supervisor stand-in: a TCPStore that outlives every attempt."""

    def __init__(self, rank: int, port: int) -> None:
        self.rank, self.attempt = rank, 0
        self.store = dist.TCPStore("127.0.0.1", port, WORLD_SIZE, is_master=rank == 0,
                                   timeout=datetime.timedelta(seconds=120))

    def next_rendezvous_port(self) -> int:
        self.attempt += 1
        key = f"attempt/{self.attempt}/port"
        if self.rank == 0:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            self.store.set(key, str(port))
        return int(self.store.get(key))

    def signal_aborted(self) -> None:
        self.store.set(f"attempt/{self.attempt}/aborted", "1")

    def wait_aborted(self) -> None:
        self.store.wait([f"attempt/{self.attempt}/aborted"])

    def finish(self) -> bool:
        """Rank 0 hosts the store, so it leaves last; True once the handshake went through."""
        if self.rank == 0:
            self.store.wait(["rank1/finished"])
            self.store.set("rank0/release", "1")
            self.store.wait(["rank1/left"])
        else:
            self.store.set("rank1/finished", "1")
            self.store.wait(["rank0/release"])
            self.store.set("rank1/left", "1")
        return True


def init_attempt(aborter: CollectiveAborter, ctl: Control) -> int:
    """What the worker does per attempt: snapshot, init, mark; returns the gloo connections."""
    port = ctl.next_rendezvous_port()
    aborter.snapshot_before_init(store_port=port)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=ctl.rank,
                            world_size=WORLD_SIZE,
                            timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    return aborter.mark_initialized()


def end_attempt(aborter: CollectiveAborter, count_meshes: bool = True) -> dict[str, Any]:
    report = teardown_process_groups(count_meshes=count_meshes)
    aborter.reset()
    return {"groups_destroyed": report.groups_destroyed,
            "meshes_alive": report.device_meshes_alive, "teardown_s": report.duration_s}


def blocked_call(aborter: CollectiveAborter, call: Callable[[], Any],
                 delay_s: float = ABORT_DELAY_S, include_store: bool = False) -> dict[str, Any]:
    """Rank 0: runs ``call`` (which blocks) while a side thread aborts after ``delay_s``."""
    marks: dict[str, Any] = {}

    def side() -> None:
        time.sleep(delay_s)
        marks["abort_at"] = time.monotonic()
        marks["report"] = aborter.abort(include_store=include_store)

    thread = threading.Thread(target=side, daemon=True)
    thread.start()
    start, error = time.monotonic(), None
    try:
        call()
    except RuntimeError as exc:
        error = str(exc)
    end = time.monotonic()
    thread.join()
    return {"raised": error is not None, "error": (error or "")[:300],
            "blocked_s": end - start, "raise_after_abort_ms": (end - marks["abort_at"]) * 1e3,
            "abort_ms": marks["report"].duration_s * 1e3,
            "sockets_shut": len(marks["report"].sockets_shut),
            "abort_errors": list(marks["report"].errors)}


def fault_protocol(aborter: CollectiveAborter, ctl: Control, rank0_call: Callable[[], Any],
                   delay_s: float = ABORT_DELAY_S) -> dict[str, Any]:
    """Rank 0 blocks in ``rank0_call`` and is aborted; rank 1 waits for that, then aborts too."""
    if ctl.rank == 0:
        out = blocked_call(aborter, rank0_call, delay_s)
        ctl.signal_aborted()
    else:
        ctl.wait_aborted()
        out = {"sockets_shut": len(aborter.abort().sockets_shut)}
    return out


class FsdpRun:
    """A tiny LLaMA sharded with FSDP2 (one group per block + root), AdamW, fixed data."""

    def __init__(self) -> None:
        self.model = build_model("tiny", seed=0)
        for block in self.model.layers:
            fully_shard(block)
        fully_shard(self.model)
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.tokens = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(0))

    def forward(self) -> torch.Tensor:
        return causal_lm_loss(self.model(self.tokens[:, :-1]), self.tokens[:, 1:])

    def forward_backward(self, reached: list[str]) -> None:
        loss = self.forward()
        reached.append("forward done")
        loss.backward()

    def step(self) -> float:
        loss = self.forward()
        loss.backward()
        self.optim.step()
        self.optim.zero_grad()
        return loss.item()


def thread_names() -> list[str]:
    """Names of this process's OS threads (native ones included), for leak messages."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as fh:
                names.append(fh.read().strip())
        except OSError:
            continue
    return names
