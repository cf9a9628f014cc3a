"""Callbacks: the order hooks fire in, a failing callback never fails the run, configs refuse
callbacks the supervisor could not receive, and the built-in metrics and display ride the same
event stream. No Ray: the supervisor runs on the dummy worker group."""

from __future__ import annotations

import threading

import pytest

import ray_resilience as rr
from ray_resilience._internal.display import ProgressDisplay
from ray_resilience._internal.supervisor.metrics import MetricsCallback, RunMetrics
from ray_resilience._internal.supervisor.outcome import RunOutcome
from ray_resilience._internal.supervisor.recorders import RecentEvents
from ray_resilience.callbacks import Callback
from ray_resilience.policy import FaultCause
from tests.support.dummy_group import Act
from tests.support.supervisor_harness import Recorder, both_rungs, make

pytestmark = pytest.mark.timeout(30)

FAULTY = {(0, 0): Act("raise", steps=2), (0, 1): Act("hang", steps=2)}


def _label(hook: str, event: object) -> str:
    if hook == "on_state_change":
        return f"{event.previous}->{event.state}"
    if hook == "on_step_completed":
        return f"step {event.step}"
    return hook


def test_hooks_fire_in_the_order_the_run_went():
    sup, _, events = make(FAULTY, both_rungs())
    sup.run()
    assert [_label(h, e) for h, e in events.events] == [
        "scheduling->starting", "on_run_start", "starting->running",
        "step 1", "step 2", "on_fault_detected", "running->restarting", "restarting->running",
        "step 1", "on_recovery_done",  # the recovery's first step makes it done
        "step 2", "step 3", "running->finished", "on_run_end"]
    (fault,) = events.of("on_fault_detected")
    assert (fault.cause, fault.ranks, fault.attempt, fault.step) == (
        FaultCause.EXCEPTION, (0,), 0, 2)
    assert "boom" in str(fault.error)
    (done,) = events.of("on_recovery_done")
    assert (done.fault_id, done.attempt, done.resumed_from_step) == (fault.fault_id, 1, 0)
    (end,) = events.of("on_run_end")
    assert (end.state, end.attempts, end.final_step, end.error) == ("finished", 2, 3, None)
    assert end.goodput is not None and end.goodput.faults[0].fault_id == fault.fault_id


class Raising(Callback):
    def __getattribute__(self, name: str):
        if name.startswith("on_") and name in dir(Callback):
            def hook(event: object) -> None:
                raise RuntimeError(f"{name} is broken")
            return hook
        return super().__getattribute__(name)


def test_a_raising_callback_is_logged_and_never_fails_the_run(caplog):
    sup, group, events = make(FAULTY, both_rungs(), callbacks=(Raising(),))
    outcome = sup.run()
    assert outcome.state == "finished" and outcome.error is None and sup.attempt == 1
    assert outcome.callback_failures["Raising.on_step_completed"] == 2 + 3  # one per step
    assert outcome.callback_failures["Raising.on_run_end"] == 1
    assert events.of("on_run_end")  # the callbacks after it were still called
    logged = [r for r in caplog.records if "Raising.on_step_completed failed" in r.getMessage()]
    assert len(logged) == 1  # the first failure is logged, the others counted


class HoldsALock(Callback):
    def __init__(self) -> None:
        self.lock = threading.Lock()


@pytest.mark.parametrize("callbacks, field", [
    ([HoldsALock()], "RunConfig.callbacks[0]"),
    ([Callback(), "on_step"], "RunConfig.callbacks[1]"),
    (Callback(), "RunConfig.callbacks"),
])
def test_callbacks_the_supervisor_could_not_receive_are_refused(callbacks, field):
    with pytest.raises(rr.ConfigError) as info:
        rr.RunConfig(callbacks=callbacks)
    assert info.value.field == field and info.value.fix


def test_a_recovery_policy_must_be_a_policy():
    with pytest.raises(rr.ConfigError, match=r"ResilienceConfig\.recovery_policy"):
        rr.ResilienceConfig(recovery_policy=lambda fault, state: None)


def test_picklable_callbacks_are_kept():
    recorder = Recorder()
    assert rr.RunConfig(callbacks=(recorder,)).callbacks == [recorder]


class CountingMetrics(RunMetrics):
    """RunMetrics that notes what it was asked to record (nothing is exported outside Ray)."""

    def __init__(self) -> None:
        super().__init__("unit", enabled=False)
        self.calls: list[tuple] = []

    def on_step(self, step: int) -> None:
        self.calls.append(("step", step))

    def on_restart(self, cause, mechanism, recovery_s, rollback_steps, rank=None) -> None:
        self.calls.append(("restart", cause, mechanism, rollback_steps, rank))

    def on_goodput(self, report) -> None:
        self.calls.append(("goodput", report.final_step))

    def on_dropped(self, kind: str) -> None:
        self.calls.append(("dropped", kind))


def test_metrics_are_fed_from_the_event_stream():
    metrics = CountingMetrics()
    sup, _, _ = make(FAULTY, both_rungs(), callbacks=(MetricsCallback(metrics),))
    sup.run()
    assert metrics.calls == [("step", 1), ("step", 2), ("step", 1), ("restart", "exception",
                             "in-process", 2, 0), ("step", 2), ("step", 3), ("goodput", 3)]


def test_the_driver_display_prints_each_event_of_the_stream_once(capsys):
    sup, _, _ = make(FAULTY, both_rungs())
    sup.run()
    status = sup.status()
    texts = [e["text"] for e in status["events"]]
    assert any(t.startswith("fault: exception on ranks [0] at step 2") for t in texts)
    assert any(t.startswith("recovered from exception by in-process") for t in texts)
    display = ProgressDisplay("unit", log_every_s=3600)
    display.update(status)
    display.update(status)  # nothing new: nothing printed twice
    printed = [line for line in capsys.readouterr().out.splitlines() if "unit  " in line]
    assert sum("fault: exception" in line for line in printed) == 1
    assert sum("running -> finished" in line for line in printed) == 1


def test_a_dropped_save_reaches_the_metrics_the_display_and_the_result():
    from ray_resilience.callbacks import CheckpointDropped  # noqa: PLC0415 - new in the fix

    dropped = CheckpointDropped(step=12, rank=1, kind="torn",
                                reason="tensor 'w' changed while copied", t=1.0)
    metrics, recent = CountingMetrics(), RecentEvents()
    MetricsCallback(metrics).on_checkpoint_dropped(dropped)
    recent.on_checkpoint_dropped(dropped)
    assert metrics.calls == [("dropped", "torn")]
    assert recent.snapshot()[0]["text"] == "checkpoint of step 12 dropped (rank 1): torn"
    outcome = RunOutcome(state="finished", checkpoint={"latest_committed_step": 10},
                         dropped_saves=[dropped], dropped_total=1)
    result = outcome.to_result("/runs/x", lambda b: b)
    assert result.checkpoint["dropped"] == [{"step": 12, "rank": 1, "kind": "torn",
                                             "reason": "tensor 'w' changed while copied"}]
    assert result.checkpoint["dropped_total"] == 1 and result.ok
    assert outcome.dropped_summary() == ("1 checkpoint save(s) were not committed: step 12 rank "
                                         "1: torn (tensor 'w' changed while copied)")
    assert RunOutcome(state="finished").dropped_summary() is None


def test_the_dropped_saves_warning_names_the_save_that_matters_first():
    """A busy run coalesces many early saves; the torn last one must still make the warning's
    line, ahead of them (it once came sixth, behind five coalesced saves, and fell off it)."""
    from ray_resilience.callbacks import CheckpointDropped  # noqa: PLC0415

    coalesced = [CheckpointDropped(step=s, rank=r, kind="coalesced", t=1.0,
                                   reason=f"replaced by the save of step {s + 2}")
                 for s in (2, 4, 6) for r in (0, 1)]
    torn = [CheckpointDropped(step=12, rank=r, kind="torn", t=2.0,
                              reason="tensor 'w' changed while copied") for r in (0, 1)]
    restart = [CheckpointDropped(step=8, rank=None, kind="restart", t=1.5,
                                 reason="a new attempt began before its shards were all durable")]
    outcome = RunOutcome(state="finished", dropped_saves=coalesced + restart + torn,
                         dropped_total=9)
    line = outcome.dropped_summary()
    assert line.startswith("9 checkpoint save(s) were not committed (2 torn, 1 restart, "
                           "6 coalesced): step 12 rank 0: torn (tensor 'w' changed while "
                           "copied); step 12 rank 1: torn"), line
    assert "step 8: restart" in line
    assert line.endswith("; and 4 more (Result.checkpoint['dropped'])"), line
    # Only part of them kept (the first 1000): no per-kind count of what was not seen.
    partial = RunOutcome(state="finished", dropped_saves=coalesced + torn, dropped_total=1500)
    assert partial.dropped_summary().startswith("1500 checkpoint save(s) were not committed: "
                                                "step 12 rank 0: torn")
