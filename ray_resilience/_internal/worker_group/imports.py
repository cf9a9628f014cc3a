"""When the run's background imports start: the writers' import of torch's DCP and the
prestarted workers' import of torch (docs/design.md, sections 2 and 6).

Both take CPU-seconds. On a node whose ranks keep every core busy (CPU training, or few cores
per GPU) they would slow the ranks' own start-up, so they wait for the run's first step; the
price is that saves requested before the writers' import ends are superseded, and a rank lost
early finds its replacement process still importing. On a node with idle cores nothing is taken
from the ranks, so they start with the ranks. The same holds after a respawn: the next prestarted
worker boots (at the ranks' priority) and imports once the recovered attempt completed a step,
or at once on a node with idle cores.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)

BUSY_CORES_PER_GPU_RANK = 2
"""Cores a GPU rank keeps busy: its training thread (launching kernels, the Python loop) and
the communication and data threads beside it."""

IMPORT_CORES = 2
"""Cores the background imports use while they run: a writer's and a prestarted worker's."""


def idle_cores_reason(info: Sequence[dict[str, Any]]) -> str | None:
    """Why the nodes hosting `info`'s ranks (each a rank's `info()`) have idle cores for the
    imports, or None when some node has not: every rank there holds a GPU and the node's cores
    (those the rank processes may run on) cover what its ranks and the imports keep busy."""
    nodes: dict[str, list[dict[str, Any]]] = {}
    for item in info:
        nodes.setdefault(str(item.get("node_id")), []).append(item)
    if not nodes:
        return None
    least = None
    for items in nodes.values():
        if not all(item.get("gpu_ids") for item in items):
            return None  # a CPU rank's intra-op threads take every core it may run on
        cores = min(int(item.get("cpus") or 0) for item in items)
        need = BUSY_CORES_PER_GPU_RANK * len(items) + IMPORT_CORES
        if cores < need:
            return None
        least = cores - need if least is None else min(least, cores - need)
    return (f"every node's ranks hold GPUs and leave at least {least} of its cores idle beyond "
            f"{BUSY_CORES_PER_GPU_RANK} per rank and {IMPORT_CORES} for the imports")


class BackgroundImports:
    """Decides once, when the ranks have started, whether the imports start then or after the
    run's first step, and says which in `Result.control["background_imports"]`."""

    def __init__(self, setting: str) -> None:
        self.setting = setting
        self.at_start = False
        self.reason = "not decided: the ranks did not start"
        self.prestarts: list[dict[str, Any]] = []
        """When prestarted workers were asked for: {"t", "attempt", "nodes"} per request."""

    def decide(self, info: Sequence[dict[str, Any]]) -> bool:
        """Whether the imports start now, with the ranks (`info`: each rank's `info()`)."""
        if self.setting == "at_start":
            self.at_start, self.reason = True, "background_imports='at_start'"
        elif self.setting == "after_first_step":
            self.at_start, self.reason = False, "background_imports='after_first_step'"
        else:
            idle = idle_cores_reason(info)
            self.at_start = idle is not None
            self.reason = idle or (
                "some node's ranks may keep every core busy (CPU ranks, or fewer than "
                f"{BUSY_CORES_PER_GPU_RANK} cores per GPU rank and {IMPORT_CORES} more)")
        log.info("background imports start %s: %s",
                 "with the ranks" if self.at_start else "after the first step", self.reason)
        return self.at_start

    def start_if_idle(self, group: Any, checkpoints: Any, t: float) -> None:
        """After the ranks started (at `t`): has the writers (`checkpoints.warm`) and the
        prestarted workers (`group.prestart`) start importing now if `decide` says so;
        otherwise the supervisor does when the run completes its first step."""
        if self.decide(group.info):
            checkpoints.warm()
            self.upkeep(group, 0, stepped=False, t=t)

    def upkeep(self, group: Any, attempt: int, *, stepped: bool, t: float) -> None:
        """Asks for the prestarted workers `group` has pending (the nodes where ranks started
        since the last request) once `attempt` completed a step (`stepped`), or at once where
        the imports start with the ranks. A respawned rank's boot and first step would share
        a busy node's cores with the next worker's boot and import."""
        if group.prestart_pending and (stepped or self.at_start):
            asked = group.prestart()
            if asked:
                self.prestarts.append({"t": t, "attempt": attempt, "nodes": len(asked)})

    def summary(self) -> dict[str, Any]:
        return {"setting": self.setting,
                "when": "at_start" if self.at_start else "after_first_step",
                "reason": self.reason, "prestarts": list(self.prestarts)}
