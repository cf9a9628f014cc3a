"""The driver's live progress (step, loss, steps/s, restarts), the run's events as they happen
(faults, recoveries, commits: from the supervisor's event stream) and the closing summary."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table


def _line(status: dict[str, Any], steps_per_s: float | None) -> str:
    metrics = status.get("metrics") or {}
    loss = metrics.get("loss")
    parts = [f"[{status.get('state')}]", f"step {status.get('step') or 0}"]
    if loss is not None:
        parts.append(f"loss {float(loss):.4f}")
    if steps_per_s:
        parts.append(f"{steps_per_s:.2f} steps/s")
    parts.append(f"attempt {status.get('attempt', 0)}")
    parts.append(f"restarts {status.get('restarts', 0)}")
    parts.append(f"{status.get('elapsed_s', 0.0):.0f} s")
    return "  ".join(parts)


class ProgressDisplay:
    """Rich live line on a terminal; a plain log line every `log_every_s` elsewhere (job logs)."""

    def __init__(self, run_name: str, *, enabled: bool = True, log_every_s: float = 5.0) -> None:
        self._enabled, self._log_every_s = enabled, log_every_s
        self._console = Console(stderr=False)
        self._tty = sys.stdout.isatty()
        self._live: Live | None = None
        self._last_log = 0.0
        self._rate: list[tuple[float, int]] = []
        self._run_name = run_name
        self._seen = 0
        """The newest event number printed."""

    def __enter__(self) -> ProgressDisplay:
        if self._enabled and self._tty:
            self._live = Live(console=self._console, refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)

    def update(self, status: dict[str, Any]) -> None:
        if not self._enabled:
            return
        self._print_events(status.get("events") or ())
        now, step = time.monotonic(), status.get("step")
        if step is not None:
            self._rate = [(t, s) for t, s in self._rate if now - t < 10.0] + [(now, step)]
        rate = None
        if len(self._rate) >= 2 and self._rate[-1][0] > self._rate[0][0]:
            (t0, s0), (t1, s1) = self._rate[0], self._rate[-1]
            rate = max(s1 - s0, 0) / (t1 - t0)
        text = f"{self._run_name}  " + _line(status, rate)
        if self._live is not None:
            self._live.update(text)
        elif now - self._last_log >= self._log_every_s:
            self._last_log = now
            print(text, flush=True)

    def _print_events(self, events: Sequence[dict[str, Any]]) -> None:
        """Each event once, above the live line (or as a log line without a terminal)."""
        for event in events:
            if event["seq"] <= self._seen:
                continue
            self._seen = event["seq"]
            line = f"{self._run_name}  {event['text']}"
            if self._live is not None:
                self._console.print(line, markup=False, highlight=False)
            else:
                print(line, flush=True)

    def summary(self, result: Any) -> None:
        if not self._enabled:
            return
        table = Table(title=f"run {self._run_name}: {result.state}", show_header=False)
        table.add_row("final step", str(result.metrics.get("step")))
        if "loss" in result.metrics:
            table.add_row("final loss", f"{float(result.metrics['loss']):.4f}")
        table.add_row("attempts", str(result.attempts))
        table.add_row("faults", str(len(result.faults)))
        table.add_row("wall time", f"{result.wall_s:.1f} s")
        table.add_row("run folder", result.path)
        if result.error is not None:
            table.add_row("error", str(result.error).splitlines()[0])
        self._console.print(table)
        if result.error is not None:
            self._console.print(str(result.error), markup=False, highlight=False)
