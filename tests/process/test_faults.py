"""Fault plans (explicit and the AWS/NVRx generator) and firing faults in real processes."""

from __future__ import annotations

import json
import os
import pickle
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ray_resilience.testing import Fault, FaultKind, FaultPlan, InjectedFault
from ray_resilience.testing.fire import HarnessFaultError, fire

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AWS_KINDS = ["exception", "sigkill", "hang"]
AWS_ARGS = dict(seed=42, fault_count=5, after_step=10, max_steps=2000)


def reference_schedule(seed, fault_count, after_step, max_steps, world_size, kinds, weights=None):
    """The AWS test case's generator, written out independently of ray_resilience."""
    rng = random.Random(seed)
    eligible = list(range(after_step + 1, max_steps + 1))
    steps = sorted(rng.sample(eligible, fault_count))
    schedule = []
    for step in steps:
        rank = rng.randint(1, world_size - 1)
        kind = rng.choices(kinds, weights=weights, k=1)[0]
        schedule.append((step, rank, kind))
    return schedule


def as_tuples(plan: FaultPlan) -> list[tuple[int, int, str]]:
    return [(f.step, f.rank, f.kind.value) for f in plan]


# Observed once from the reference algorithm above; a change to either side fails the tests.
EXPECTED_WS16 = [(62, 4, "exception"), (239, 12, "exception"), (574, 12, "hang"),
                 (1320, 2, "sigkill"), (1529, 1, "exception")]
EXPECTED_WS2 = [(62, 1, "exception"), (239, 1, "hang"), (574, 1, "sigkill"),
                (1320, 1, "exception"), (1529, 1, "exception")]
EXPECTED_WS16_WEIGHTED = [(62, 4, "exception"), (239, 12, "exception"), (574, 12, "sigkill"),
                          (1320, 2, "exception"), (1529, 1, "exception")]


@pytest.mark.parametrize(("world_size", "kinds", "weights", "expected"), [
    (16, AWS_KINDS, None, EXPECTED_WS16),
    (2, AWS_KINDS, None, EXPECTED_WS2),
    (16, ["exception", "sigkill"], [0.7, 0.3], EXPECTED_WS16_WEIGHTED),
])
def test_generate_reproduces_aws_schedule(world_size, kinds, weights, expected):
    plan = FaultPlan.generate(**AWS_ARGS, world_size=world_size, kinds=kinds, weights=weights)
    assert as_tuples(plan) == expected
    assert reference_schedule(**AWS_ARGS, world_size=world_size, kinds=kinds,
                              weights=weights) == expected
    assert [f.id for f in plan][0] == f"f1@step62/rank{expected[0][1]}/exception"


def test_generate_never_targets_rank_zero_and_stays_in_range():
    for seed in range(50):
        plan = FaultPlan.generate(seed=seed, fault_count=8, after_step=5, max_steps=40,
                                  world_size=3, kinds=list(FaultKind))
        steps = [f.step for f in plan]
        assert steps == sorted(set(steps)) and len(steps) == 8
        assert all(6 <= s <= 40 for s in steps)
        assert all(1 <= f.rank <= 2 for f in plan)


@pytest.mark.parametrize(("overrides", "field"), [
    (dict(world_size=1), "world_size"),
    (dict(fault_count=2000), "fault_count"),
    (dict(fault_count=-1), "fault_count"),
    (dict(max_steps=10), "max_steps"),
    (dict(kinds=[]), "kinds"),
    (dict(kinds=["segfault"]), "kinds"),
    (dict(weights=[1.0]), "weights"),
    (dict(weights=[0.0, 0.0, 0.0]), "weights"),
])
def test_generate_rejects_bad_arguments_naming_the_field(overrides, field):
    args = {**AWS_ARGS, "world_size": 4, "kinds": AWS_KINDS, **overrides}
    with pytest.raises(ValueError, match=field):
        FaultPlan.generate(**args)


@pytest.mark.parametrize(("kwargs", "field"), [
    (dict(step=0, rank=1, kind="sigkill"), "Fault.step"),
    (dict(step=3, rank=-1, kind="sigkill"), "Fault.rank"),
    (dict(step=3, rank=1, kind="explode"), "Fault.kind"),
    (dict(step=3, rank=1, kind="hang", phase="backward"), "Fault.phase"),
])
def test_fault_validation_names_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Fault(**kwargs)


def test_explicit_plan_sorts_numbers_and_filters():
    plan = FaultPlan.explicit([
        Fault(step=30, rank=0, kind="exception"),
        {"step": 10, "rank": 1, "kind": "sigkill"},
        Fault(step=10, rank=1, kind=FaultKind.OOM),
    ])
    assert [f.id for f in plan] == [
        "f1@step10/rank1/oom", "f2@step10/rank1/sigkill", "f3@step30/rank0/exception"]
    assert [f.kind for f in plan.for_rank_step(1, 10)] == [FaultKind.OOM, FaultKind.SIGKILL]
    assert plan.for_rank_step(1, 10, exclude={"f1@step10/rank1/oom"}) == [
        Fault(step=10, rank=1, kind="sigkill")]
    assert plan.for_rank_step(0, 10) == [] and plan.for_rank_step(1, 10, phase="init") == []
    assert plan.get("f3@step30/rank0/exception").rank == 0
    with pytest.raises(KeyError):
        plan.get("f9@step1/rank0/hang")
    assert len(FaultPlan.none()) == 0 and FaultPlan(faults=[]) == FaultPlan.none()


def test_plan_rejects_duplicates_and_unreachable_faults():
    with pytest.raises(ValueError, match="twice"):
        FaultPlan.explicit([Fault(step=5, rank=1, kind="hang")] * 2)
    plan = FaultPlan.explicit([Fault(step=50, rank=3, kind="hang")])
    plan.validate_for(world_size=4, max_steps=50)
    with pytest.raises(ValueError, match="rank=3.*world_size=3"):
        plan.validate_for(world_size=3, max_steps=50)
    with pytest.raises(ValueError, match="step=50.*max_steps=49"):
        plan.validate_for(world_size=4, max_steps=49)


def test_plan_round_trips_through_json():
    plan = FaultPlan.generate(**AWS_ARGS, world_size=8, kinds=list(FaultKind))
    again = FaultPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan and [f.id for f in again] == [f.id for f in plan]
    with pytest.raises(ValueError, match="keys"):
        FaultPlan.from_dict({"faults": [{"step": 1, "rank": 1, "kind": "hang", "when": 2}]})
    with pytest.raises(ValueError, match="keys"):
        FaultPlan.from_dict({"faults": [{"step": 1, "kind": "hang"}]})


def test_injected_fault_survives_pickling_and_kinds_know_who_fires_them():
    fault = Fault(step=7, rank=1, kind="exception", index=2)
    error = pickle.loads(pickle.dumps(InjectedFault(fault)))
    assert isinstance(error, RuntimeError) and error.fault == fault
    assert "f2@step7/rank1/exception" in str(error)
    assert FaultKind.OOM.recorded_cause == "oom"
    assert FaultKind.SIGKILL.recorded_cause == "process_killed"
    worker_kinds = {k for k in FaultKind if k.fired_in_worker}
    assert worker_kinds == {FaultKind.EXCEPTION, FaultKind.HANG, FaultKind.NATIVE_HANG,
                            FaultKind.SIGKILL, FaultKind.OOM}


@pytest.mark.parametrize("kind", ["node_loss", "writer_kill", "storage_outage",
                                  "corrupt_checkpoint"])
def test_fire_refuses_harness_kinds(kind):
    with pytest.raises(HarnessFaultError, match="supervisor or the test harness"):
        fire(Fault(step=1, rank=1, kind=kind))


def run_child(body: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
    """Run `body` in a fresh interpreter with ray_resilience importable."""
    code = "from ray_resilience.testing import Fault\n" \
           "from ray_resilience.testing.fire import fire\n" + textwrap.dedent(body)
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.parametrize("kind", ["sigkill", "oom"])
def test_sigkill_and_oom_end_the_process_with_sigkill(kind):
    child = run_child(f"fire(Fault(step=3, rank=1, kind={kind!r}))\nprint('survived')")
    assert child.returncode == -signal.SIGKILL
    assert "survived" not in child.stdout
    assert f"firing injected fault f@step3/rank1/{kind}" in child.stderr


def test_exception_fault_raises_injected_fault():
    child = run_child("fire(Fault(step=3, rank=1, kind='exception'))")
    assert child.returncode == 1
    assert "InjectedFault: injected fault f@step3/rank1/exception" in child.stderr


ASYNC_INTERRUPT = """
import ctypes, os, threading
class Interrupt(Exception):
    pass
outcome = []
def target():
    try:
        fire(Fault(step=3, rank=1, kind={kind!r}))
    except Interrupt:
        outcome.append("interrupted")
thread = threading.Thread(target=target, daemon=True)
thread.start()
thread.join(0.3)
ctypes.pythonapi.PyThreadState_SetAsyncExc(
    ctypes.c_ulong(thread.ident), ctypes.py_object(Interrupt))
thread.join({wait_s})
print("alive" if thread.is_alive() else "ended", outcome, flush=True)
os._exit(0)
"""


def test_python_hang_is_ended_by_an_async_exception():
    child = run_child(ASYNC_INTERRUPT.format(kind="hang", wait_s=5.0))
    assert child.stdout.strip() == "ended ['interrupted']", child.stderr


def test_native_hang_ignores_an_async_exception():
    child = run_child(ASYNC_INTERRUPT.format(kind="native_hang", wait_s=1.0))
    assert child.stdout.strip() == "alive []", child.stderr


def test_stop_process_freezes_the_whole_process():
    code = ("from ray_resilience.testing.fire import stop_process\n"
            "stop_process()\nprint('resumed')")
    child = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": ROOT},
                             stdout=subprocess.PIPE, text=True)
    try:
        deadline, state = time.monotonic() + 10.0, ""
        while time.monotonic() < deadline and state != "T":
            with open(f"/proc/{child.pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            time.sleep(0.05)
        assert state == "T"
    finally:
        child.kill()
        child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL
