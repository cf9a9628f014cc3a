"""What the fault-free overhead benchmark runs: arms (a mechanism, from this checkout or another)
and the per-size run lengths and checkpoint intervals.

- torchrun: the loop under `torchrun`, no checkpoints: what a user compares against;
- ours-disabled: `ResilienceConfig.disabled()`, no checkpoints: Ray actors and our rank
  machinery with nothing recovering;
- ours: `ResilienceConfig.default()` with committed checkpoints every `durable_every` steps and
  the local tier as the library's default runs it (`local_interval_steps="auto"`: the interval
  whose measured cost stays within 1% of step time, at every size);
- ours-nockpt (not run by default): `ResilienceConfig.default()` with nothing saved, which
  splits ours' cost between the recovery rungs' machinery and the checkpoint work;
- ours-nolocal (not run by default): ours' committed checkpoints with the local tier off, which
  splits the checkpoint work between committed saves and the local tier;
- torchrun-dcp (not run by default): the loop under torchrun saving the same steps as
  ours-nolocal with DCP `async_save` in its fastest configuration (`harness.dcp_io`), no local
  tier: what the same saves cost a torchrun user on this machine, so ours' committed-save cost
  is read against the same work, not against no saves at all.
An arm `NAME@LABEL` runs mechanism NAME from the checkout given as `LABEL=PATH`: the same
harness, another version of the library (before/after a change).
"""

from __future__ import annotations

import dataclasses
import os

from harness.launcher import BENCH_PATHS
from harness.spec import LOCAL_AUTO, Workload

PAGE_ARMS = ("torchrun", "torchrun-dcp", "ours-disabled", "ours-nockpt", "ours-nolocal", "ours")
"""Every arm, in the page's row order: what the docs' sittings run (`run_all.py`)."""
CHECKPOINTING = ("ours", "ours-nolocal", "torchrun-dcp")
"""Mechanisms the benchmark runs with checkpoints; every other arm runs without."""
NO_LOCAL = ("ours-nolocal", "torchrun-dcp")
"""Of those, the ones that run with the local tier off."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Setting:
    """Run length and intervals at one size."""

    steps: int
    warmup: int
    """Steps left out of the statistics (first steps: allocator and caches warming up)."""
    durable_every: int
    local_every: int | str
    """The local tier's interval for ours ("auto": the library's default)."""


#: Long enough that saves repeat inside the measured steps (one-time costs of the first saves
#: fall in the first half; `overhead/steps.py` reports the second half apart).
SETTINGS = {
    "tiny": Setting(steps=400, warmup=10, durable_every=10, local_every=LOCAL_AUTO),
    "200mb": Setting(steps=60, warmup=5, durable_every=10, local_every=LOCAL_AUTO),
    "1gb": Setting(steps=24, warmup=4, durable_every=8, local_every=LOCAL_AUTO),
}


@dataclasses.dataclass(frozen=True)
class Arm:
    name: str
    """As given: `mechanism` or `mechanism@label`."""
    mechanism: str
    checkout: str | None
    """Root of the checkout whose code runs; None: this one."""

    @property
    def paths(self) -> list[str]:
        """PYTHONPATH entries that make the runner import this arm's code."""
        if self.checkout is None:
            return list(BENCH_PATHS)
        return [os.path.join(self.checkout, "jobs", "bench"), self.checkout]

    def workload(self, base: Workload, setting: Setting) -> Workload:
        if self.mechanism not in CHECKPOINTING:
            return base.with_(checkpoint_interval=0, local_interval=0)
        return base.with_(checkpoint_interval=setting.durable_every,
                          local_interval=0 if self.mechanism in NO_LOCAL else setting.local_every)


def parse_arms(names: list[str], checkouts: dict[str, str]) -> list[Arm]:
    """Arms from `mechanism[@label]` names; raises ValueError for an unknown label."""
    arms = []
    for name in names:
        mechanism, _, label = name.partition("@")
        if label and label not in checkouts:
            raise ValueError(f"arm {name!r}: no --checkout {label}=PATH given")
        arms.append(Arm(name, mechanism, os.path.abspath(checkouts[label]) if label else None))
    return arms
