"""Timeline pictures: written, non-empty, real PNGs; bad input refused."""

from __future__ import annotations

import pytest

from ray_resilience.goodput import compute_goodput
from ray_resilience.goodput.plot import plot_comparison, plot_timeline
from tests.support.timelines import rollback_run, steady_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000


def test_plot_timeline_from_timeline_and_from_report(tmp_path):
    timeline = rollback_run()
    assert plot_timeline(timeline, str(tmp_path / "a.png")) == str(tmp_path / "a.png")
    plot_timeline(compute_goodput(timeline), str(tmp_path / "b.png"), title="rollback")
    assert_png(tmp_path / "a.png")
    assert_png(tmp_path / "b.png")


def test_plot_comparison_overlays_mechanisms(tmp_path):
    slow, _ = steady_run(step_s=1.5, saves={50: 3.0})
    path = plot_comparison({"ours": compute_goodput(rollback_run()), "peer": slow},
                           str(tmp_path / "cmp.png"))
    assert path == str(tmp_path / "cmp.png")
    assert_png(tmp_path / "cmp.png")


def test_plot_refuses_empty_input(tmp_path):
    with pytest.raises(ValueError, match="runs"):
        plot_comparison({}, str(tmp_path / "x.png"))
    report = compute_goodput(steady_run(steps=5)[0])
    detached = type(report)(**{**report.__dict__, "timeline": None})
    with pytest.raises(ValueError, match="no timeline"):
        plot_timeline(detached, str(tmp_path / "y.png"))
    assert not (tmp_path / "x.png").exists() and not (tmp_path / "y.png").exists()
