"""The control-plane benchmark's report and docs/scale.md are generated, never typed: the
committed scale tables are what scale.py computes from the committed results, and the section
renders every measured figure of a result file."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "jobs", "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

from controlplane import scale  # noqa: E402 - after the path set-up above
from report import control_plane  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def test_the_committed_scale_tables_are_what_scale_py_computes() -> None:
    assert scale.main(["--check"]) == 0


def test_nearest_rank_quantiles_take_the_worst_of_few_trials() -> None:
    assert control_plane.quantile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert control_plane.quantile([3.0, 1.0, 2.0], 0.99) == 3.0
    assert control_plane.quantile([], 0.5) is None


def _size(n: int) -> dict:
    trial = {"detect_s": 0.25, "launch_s": 0.5, "cause": "actor_died"}
    steady = {"supervisor_cpu_core_fraction": 0.125, "supervisor_rss_mb": 150.0,
              "batches_per_s": 16.0, "reports_per_s": 128.0, "steps_per_s": 2.0}
    rounds = {"round_s": [0.5], "claimed_fraction": 1.0, "coordinator_cpu_s_per_round": 0.25,
              "coordinator_rss_mb": 90.0}
    return {"world_size": n, "nodes": n // 16, "steady": steady, "steady_after": steady,
            "dead_rank": [trial], "hung_rank": [trial], "lost_node": [trial],
            "memory": [[0, 100.0], [100, 101.0], [500, 101.0], [1000, 101.0]],
            "save_rounds": {"per_rank": rounds, "per_node": rounds}, "run_state": "finished",
            "control": {}}


def test_the_section_shows_each_size_with_its_measured_figures() -> None:
    doc = {"quick": True, "date_utc": "2026-01-01 00:00", "command": "x", "duration_s": 1.0,
           "ranks_per_node": 16, "settings": {"interval": 0.25, "step_s": 0.5,
                                               "step_timeout": 3.0},
           "sizes": [_size(64), _size(4096)]}
    text = control_plane.section(doc)
    assert "| 4096 | 256 | 12.5% | 150 MB | 16 | 128 | 250.0 ms / 250.0 ms (n=1) |" in text
    assert "101 → 101 MB over 1000 steps" in text and "Quick run" in text
    assert control_plane.memory_growth(doc["sizes"][0]["memory"])["slope_bytes_per_step"] == 0.0


def test_a_failed_trial_is_counted_not_averaged() -> None:
    trials = [{"detect_s": 0.25, "launch_s": 0.5, "cause": "actor_died"},
              {"error": "no matching event within 120 s"}]
    assert control_plane.values(trials, "detect_s") == [0.25]
    assert control_plane._p(trials) == "250.0 ms / 250.0 ms (n=1, 1 failed)"
    assert control_plane._p(trials[1:]) == "1 failed"
