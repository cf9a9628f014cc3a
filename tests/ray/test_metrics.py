"""Ray metrics exporter: a no-op outside Ray, real metrics inside, never raises into the run."""

from __future__ import annotations

from ray_resilience._internal.supervisor import metrics as metrics_module
from ray_resilience._internal.supervisor.metrics import (
    EXPORTED_METRICS,
    RunMetrics,
    prometheus_names,
)
from ray_resilience.goodput import compute_goodput
from tests.support.timelines import rollback_run


def exercise(run_metrics: RunMetrics) -> None:
    run_metrics.on_step(10)
    run_metrics.on_checkpoint(10, save_latency_s=0.4, blocking_s=0.02)
    run_metrics.on_step(11)
    run_metrics.on_restart("process_killed", "in_process", 4.5, 10)
    run_metrics.on_restart("hang", "replace_failed", None, None)
    run_metrics.on_dropped("torn")
    run_metrics.on_goodput(compute_goodput(rollback_run()))


def test_names_are_prefixed_unique_and_mapped_to_prometheus():
    assert len(set(EXPORTED_METRICS)) == len(EXPORTED_METRICS) == 10
    assert all(name.startswith("ray_resilience_") for name in EXPORTED_METRICS)
    series = prometheus_names()
    assert set(series) == set(EXPORTED_METRICS)
    assert series["ray_resilience_restarts"] == ("ray_ray_resilience_restarts_total",)
    assert "ray_ray_resilience_recovery_time_s_bucket" in series["ray_resilience_recovery_time_s"]


def test_no_op_without_ray_or_when_disabled(monkeypatch):
    monkeypatch.setattr(metrics_module, "_ray_connected", lambda: False)
    outside = RunMetrics("unit")
    exercise(outside)
    assert not outside.active
    disabled = RunMetrics("unit", enabled=False)
    exercise(disabled)
    assert not disabled.active


def test_records_inside_ray(ray_session):
    run_metrics = RunMetrics("test-run")
    assert run_metrics.active
    created = run_metrics._metrics
    assert tuple(created) == EXPORTED_METRICS
    assert [m.info["name"] for m in created.values()] == list(EXPORTED_METRICS)
    assert all(m.info["default_tags"] == {"run": "test-run"} for m in created.values())
    exercise(run_metrics)
    assert run_metrics.active


def test_recording_error_turns_export_off_instead_of_raising(ray_session):
    run_metrics = RunMetrics("test-run-bad")
    run_metrics.on_restart(cause=None, mechanism="in_process", recovery_s=1.0, rollback_steps=1)
    assert not run_metrics.active
    run_metrics.on_step(3)  # still no error


def test_records_inside_a_ray_task(ray_session):
    @ray_session.remote(num_cpus=0)
    def record() -> bool:
        run_metrics = RunMetrics("task-run")
        exercise(run_metrics)
        return run_metrics.active

    assert ray_session.get(record.remote(), timeout=120) is True
