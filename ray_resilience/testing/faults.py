"""Fault plans: which fault fires on which rank at which step, explicit or generated (the
AWS/NVRx test case's schedule). A fault fires once per run, also when its step is trained again.
"""

from __future__ import annotations

import dataclasses
import enum
import random
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

from ray_resilience import _validate as check
from ray_resilience.errors import ConfigError

#: Where in a rank's life a fault fires.
FAULT_PHASES: tuple[str, ...] = ("step", "init", "checkpoint_save", "checkpoint_load", "validation")


class FaultKind(str, enum.Enum):  # noqa: UP042 - StrEnum would change str(kind)
    """What an injected fault does. Values are the strings used in plans and JSON."""

    EXCEPTION = "exception"  # the train function raises InjectedFault
    HANG = "hang"  # a Python-level sleep loop; an async exception can interrupt it
    NATIVE_HANG = "native_hang"  # blocked inside one C call; async exceptions cannot interrupt it
    SIGKILL = "sigkill"  # the rank's process is killed with SIGKILL
    OOM = "oom"  # SIGKILL, as the kernel OOM killer does it; recorded with cause "oom"
    NODE_LOSS = "node_loss"  # a node of the (simulated) cluster disappears
    WRITER_KILL = "writer_kill"  # a checkpoint writer actor is killed
    STORAGE_OUTAGE = "storage_outage"  # checkpoint storage stops answering for a while
    CORRUPT_CHECKPOINT = "corrupt_checkpoint"  # the newest committed checkpoint is damaged

    @property
    def fired_in_worker(self) -> bool:
        """True if the training thread fires it (`fire.fire`); else the harness does."""
        return self in _WORKER_KINDS

    @property
    def recorded_cause(self) -> str:
        """The cause to record: the plan's, since an OOM kill and `kill -9` look alike."""
        return _RECORDED_CAUSES.get(self, self.value)


_WORKER_KINDS = frozenset(
    {FaultKind.EXCEPTION, FaultKind.HANG, FaultKind.NATIVE_HANG, FaultKind.SIGKILL, FaultKind.OOM}
)
_RECORDED_CAUSES = {FaultKind.NATIVE_HANG: "hang", FaultKind.SIGKILL: "process_killed"}


def _require_int(field: str, value: Any, minimum: int, fix: str) -> None:
    check.integer(field, value, minimum=minimum, fix=fix)


def _as_kind(value: Any, field: str = "kind") -> FaultKind:
    try:
        return FaultKind(value)
    except ValueError:
        choices = ", ".join(k.value for k in FaultKind)
        raise ConfigError(field, value, f"is not a fault kind; use one of: {choices}.") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Fault:
    """One fault: fire `kind` on `rank` when it reaches `step` (in `phase`)."""

    step: int
    """Training step (1-based) at which the fault fires."""
    rank: int
    """Global rank that fires it (harness-fired kinds use it to pick the node or writer)."""
    kind: FaultKind
    """What happens; a plain string is converted."""
    phase: str = "step"
    """Where in the rank's life it fires: one of FAULT_PHASES."""
    index: int | None = dataclasses.field(default=None, compare=False)
    """1-based position in its plan, set by FaultPlan; only used to build `id`."""

    def __post_init__(self) -> None:
        _require_int("Fault.step", self.step, 1, "Steps are 1-based; use step >= 1.")
        _require_int("Fault.rank", self.rank, 0, "Use a global rank in [0, world_size).")
        object.__setattr__(self, "kind", _as_kind(self.kind, "Fault.kind"))
        if self.phase not in FAULT_PHASES:
            raise ConfigError("Fault.phase", self.phase, f"use one of {FAULT_PHASES}.")

    @property
    def id(self) -> str:
        """Stable id for logs and goodput, e.g. "f3@step120/rank1/sigkill" ("f@..." outside a
        plan)."""
        where = f"step{self.step}" if self.phase == "step" else f"{self.phase}{self.step}"
        prefix = f"f{self.index}" if self.index is not None else "f"
        return f"{prefix}@{where}/rank{self.rank}/{self.kind.value}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form (the index is implied by the position in the plan)."""
        return {"step": self.step, "rank": self.rank, "kind": self.kind.value, "phase": self.phase}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fault:
        """Inverse of `to_dict`; unknown or missing keys are errors, so typos do not pass."""
        if not isinstance(data, Mapping):
            raise check.wrong_type("Fault", data, "a Fault or a dict of step, rank, kind, phase")
        if not {"step", "rank", "kind"} <= set(data) <= {"step", "rank", "kind", "phase"}:
            raise ConfigError("Fault", dict(data), "use the keys step, rank, kind and phase.")
        return cls(**data)


class InjectedFault(RuntimeError):
    """Raised by an `exception` fault. Not a real failure: the run's FaultPlan asked for it."""

    def __init__(self, fault: Fault) -> None:
        super().__init__(
            f"injected fault {fault.id} (kind {fault.kind.value!r}) on rank {fault.rank} at "
            f"step {fault.step}; it comes from the run's FaultPlan, remove it there to stop it."
        )
        self.fault = fault

    def __reduce__(self) -> tuple[type[InjectedFault], tuple[Fault]]:
        # Crosses actor boundaries by pickling; keep the structured fault, not just the message.
        return (InjectedFault, (self.fault,))


@dataclasses.dataclass(frozen=True, kw_only=True)
class FaultPlan:
    """An immutable, ordered set of faults for one run, sorted by (step, rank, phase, kind) and
    numbered f1, f2, ... in that order; a duplicate is an error."""

    faults: tuple[Fault, ...] = ()
    """The faults; a list (of Fault or of dicts from `Fault.to_dict`) is accepted."""

    def __post_init__(self) -> None:
        if isinstance(self.faults, str | bytes | Mapping) or not isinstance(self.faults,
                                                                            Sequence):
            raise check.wrong_type("FaultPlan.faults", self.faults, "a list of Fault",
                                   "Build plans with FaultPlan.explicit([...]).")
        faults = [f if isinstance(f, Fault) else Fault.from_dict(f) for f in self.faults]
        faults.sort(key=lambda f: (f.step, f.rank, FAULT_PHASES.index(f.phase), f.kind.value))
        numbered = tuple(dataclasses.replace(f, index=i) for i, f in enumerate(faults, start=1))
        seen: set[tuple[int, int, str, FaultKind]] = set()
        for fault in numbered:
            key = (fault.step, fault.rank, fault.phase, fault.kind)
            if key in seen:
                raise ConfigError("FaultPlan.faults", fault.id, "is listed twice; list each "
                                                                "fault once.")
            seen.add(key)
        object.__setattr__(self, "faults", numbered)

    @classmethod
    def none(cls) -> FaultPlan:
        """The empty plan: nothing is injected."""
        return cls()

    @classmethod
    def explicit(cls, faults: Sequence[Fault | Mapping[str, Any]]) -> FaultPlan:
        """A plan from a hand-written list, e.g. `[Fault(step=20, rank=1, kind="sigkill")]`."""
        return cls(faults=tuple(faults))

    def __len__(self) -> int:
        return len(self.faults)

    def __iter__(self) -> Iterator[Fault]:
        return iter(self.faults)

    def get(self, fault_id: str) -> Fault:
        """The fault with this id; KeyError if the plan has none."""
        for fault in self.faults:
            if fault.id == fault_id:
                return fault
        raise KeyError(f"no fault {fault_id!r} in this plan; ids: {[f.id for f in self.faults]}")

    def for_rank_step(
        self, rank: int, step: int, *, phase: str = "step", exclude: Collection[str] = ()
    ) -> list[Fault]:
        """Faults due on `rank` at `step` in `phase`, minus the ids already fired (`exclude`)."""
        return [
            f for f in self.faults
            if f.step == step and f.rank == rank and f.phase == phase and f.id not in exclude
        ]

    def validate_for(self, *, world_size: int, max_steps: int) -> None:
        """Raise ConfigError if a fault targets a rank or step the run will never reach."""
        for f in self.faults:
            if f.rank >= world_size or f.step > max_steps:
                raise ConfigError(
                    "ResilienceConfig.fault_plan", f.id,
                    f"rank={f.rank}, step={f.step} is never reached with "
                    f"world_size={world_size}, max_steps={max_steps}; target a rank below "
                    f"{world_size} and a step <= {max_steps}, or enlarge the run.")

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe form: `{"faults": [{"step", "rank", "kind", "phase"}, ...]}`."""
        return {"faults": [f.to_dict() for f in self.faults]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FaultPlan:
        """Inverse of `to_dict`."""
        if set(data) != {"faults"}:
            raise ConfigError("FaultPlan", dict(data), "expected only the key 'faults'.")
        return cls(faults=tuple(Fault.from_dict(f) for f in data["faults"]))

    @classmethod
    def generate(
        cls,
        *,
        seed: int,
        fault_count: int,
        after_step: int,
        max_steps: int,
        world_size: int,
        kinds: Sequence[FaultKind | str],
        weights: Sequence[float] | None = None,
    ) -> FaultPlan:
        """The AWS/NVRx test case's deterministic schedule, drawn from `random.Random(seed)` in the
        reference script's order (steps, then per step a rank other than 0 and a kind)."""
        _check_generate_args(seed, fault_count, after_step, max_steps, world_size, kinds, weights)
        kind_list = [_as_kind(k, "kinds") for k in kinds]
        rng = random.Random(seed)
        steps = sorted(rng.sample(range(after_step + 1, max_steps + 1), fault_count))
        faults = []
        for step in steps:
            rank = rng.randint(1, world_size - 1)
            kind = rng.choices(kind_list, weights=weights, k=1)[0]
            faults.append(Fault(step=step, rank=rank, kind=kind))
        return cls(faults=tuple(faults))


def _check_generate_args(
    seed: int,
    fault_count: int,
    after_step: int,
    max_steps: int,
    world_size: int,
    kinds: Sequence[FaultKind | str],
    weights: Sequence[float] | None,
) -> None:
    """Validate `FaultPlan.generate`'s arguments before any random number is drawn."""
    _require_int("world_size", world_size, 2, "The generator never targets rank 0; use >= 2.")
    check.integer("seed", seed)
    _require_int("fault_count", fault_count, 0, "Use 0 for no faults.")
    _require_int("after_step", after_step, 0, "Use 0 to allow faults from step 1.")
    _require_int("max_steps", max_steps, after_step + 1, "max_steps must exceed after_step.")
    if fault_count > max_steps - after_step:
        raise ConfigError("fault_count", fault_count,
                          f"is more than the {max_steps - after_step} steps in "
                          f"{after_step + 1}..{max_steps}; lower fault_count or widen the range.")
    if isinstance(kinds, str) or not isinstance(kinds, Sequence) or len(kinds) == 0:
        raise ConfigError("kinds", kinds, "pass a non-empty list such as ['sigkill'].")
    if weights is None:
        return
    fix = (f"give one non-negative weight per kind ({len(kinds)} kinds) with a positive sum, "
           "or None for equal weights.")
    if isinstance(weights, str) or not isinstance(weights, Sequence) or len(weights) != len(kinds):
        raise ConfigError("weights", weights, fix)
    for i, weight in enumerate(weights):
        check.number(f"weights[{i}]", weight, minimum=0, fix=fix)
    if sum(weights) <= 0:
        raise ConfigError("weights", list(weights), fix)
