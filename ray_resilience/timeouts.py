"""Hang timeouts learned from the workload: `AdaptiveTimeouts` sets each phase's timeout to a
multiple of the longest interval seen, never below a floor; every change is logged.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import threading

from ray_resilience import _validate as check

log = logging.getLogger(__name__)


@dataclasses.dataclass(kw_only=True)
class AdaptiveTimeouts:
    """How learned timeouts are derived: max(floor, multiplier x worst observed)."""

    multiplier: float = 4.0
    """Timeout = multiplier x the longest interval observed in that phase."""
    step_floor_s: float = 10.0
    """The steady-step timeout never drops below this."""
    first_step_floor_s: float = 60.0
    """The first-step timeout (model build, checkpoint load, compile) never drops below this."""
    phase_floor_s: float = 30.0
    """Timeouts of user-marked phases never drop below this."""
    min_samples: int = 5
    """Observations of a phase needed before its timeout is derived from them."""
    pinned: frozenset[str] = frozenset()
    """Names that keep their configured value: "step", "first_step", or a phase name."""

    def __post_init__(self) -> None:
        check.number("AdaptiveTimeouts.multiplier", self.multiplier, minimum=1.5,
                     fix="A timeout at the worst observed interval kills healthy runs.")
        for name in ("step_floor_s", "first_step_floor_s", "phase_floor_s"):
            check.seconds(f"AdaptiveTimeouts.{name}", getattr(self, name))
        check.integer("AdaptiveTimeouts.min_samples", self.min_samples, minimum=1)
        self.pinned = check.string_set("AdaptiveTimeouts.pinned", self.pinned)

    def floor(self, name: str) -> float:
        return {"step": self.step_floor_s, "first_step": self.first_step_floor_s}.get(
            name, self.phase_floor_s)


class LearnedTimeouts:
    """The supervisor's current timeouts and the worst intervals seen. Thread-safe."""

    def __init__(self, *, step_s: float, first_step_s: float, phases_s: dict[str, float],
                 adaptive: AdaptiveTimeouts | None) -> None:
        self._values = {"step": step_s, "first_step": first_step_s, **phases_s}
        self._phases = tuple(phases_s)
        self._unknown: set[str] = set()
        self._adaptive = adaptive
        self._worst: dict[str, float] = {}
        self._count: dict[str, int] = {}
        self._lock = threading.Lock()

    def limit(self, name: str) -> float:
        """The timeout for `name`; an unknown phase falls back to the steady-step timeout (and
        is logged once, with the configured name it may be a misspelling of)."""
        with self._lock:
            if name not in self._values and name not in self._unknown:
                self._unknown.add(name)
                near = difflib.get_close_matches(name, self._phases, n=1, cutoff=0.6)
                if near:
                    log.warning("phase %r has no timeout of its own, so the step timeout applies; "
                                "ResilienceConfig.phase_timeouts_s has %r: a misspelling?",
                                name, near[0])
            return self._values.get(name, self._values["step"])

    def observe(self, name: str, seconds: float) -> None:
        """Records one interval of `name` and, when adaptive, re-derives its timeout."""
        self.observe_many(name, 1, seconds)

    def observe_many(self, name: str, count: int, worst_s: float) -> None:
        """Records `count` intervals of `name`, the longest `worst_s` (a node's batch)."""
        with self._lock:
            self._count[name] = self._count.get(name, 0) + count
            worst = self._worst[name] = max(worst_s, self._worst.get(name, 0.0))
            rule = self._adaptive
            if rule is None or name in rule.pinned or self._count[name] < rule.min_samples:
                return
            new = max(rule.floor(name), rule.multiplier * worst)
            old = self._values.get(name, self._values["step"])
            if abs(new - old) > 0.05 * old:
                self._values[name] = new
                log.warning("timeout %r: %.1f s -> %.1f s (worst observed %.2f s x %.1f, floor "
                            "%.1f s)", name, old, new, worst, rule.multiplier, rule.floor(name))

    def snapshot(self) -> dict[str, dict[str, float]]:
        with self._lock:
            return {"timeouts_s": dict(self._values), "worst_observed_s": dict(self._worst),
                    "observations": dict(self._count)}
