"""Thread priorities (Linux): "background" sits a fixed number of nice levels below its
process, and the ranks' nice value is the job's choice where it makes one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ray_resilience._internal.priority import BACKGROUND_STEPS, rank_niceness

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHILD = """
import json, os
from ray_resilience._internal.priority import lower_thread
how = lower_thread("background")
print(json.dumps({"how": how, "nice": os.getpriority(os.PRIO_PROCESS, 0),
                  "policy": os.sched_getscheduler(0)}))
"""


def _background_from(nice: int) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                         timeout=60, preexec_fn=lambda: os.nice(nice), check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(60)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread priorities: Linux")
def test_background_is_eleven_nice_levels_below_a_rank_at_nice_0():
    assert _background_from(0) == {"how": "nice", "nice": BACKGROUND_STEPS,
                                   "policy": os.SCHED_BATCH}


@pytest.mark.timeout(60)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread priorities: Linux")
def test_background_below_rays_nice_15_is_sched_idle():
    # 15 + 11 passes 19: SCHED_IDLE, about the same share against nice-15 ranks.
    assert _background_from(15) == {"how": "idle", "nice": 15, "policy": os.SCHED_IDLE}


@pytest.mark.timeout(10)
def test_ranks_start_at_nice_0_unless_the_job_chooses(monkeypatch):
    monkeypatch.delenv("RAY_worker_niceness", raising=False)
    assert rank_niceness() == {"RAY_worker_niceness": "0"}
    monkeypatch.setenv("RAY_worker_niceness", "15")  # the job's runtime env sets it
    assert rank_niceness() == {"RAY_worker_niceness": "15"}


RESTORE = """
import json, os, threading
from ray_resilience._internal.priority import lower_thread, restore_thread
lowered, done = threading.Event(), threading.Event()
def background():
    lower_thread("idle")
    lowered.set()
    done.wait(30)
thread = threading.Thread(target=background)
thread.start()
lowered.wait(30)
before = os.sched_getscheduler(thread.native_id)
ok = restore_thread(thread.native_id)
print(json.dumps({"before": before, "ok": ok, "policy": os.sched_getscheduler(thread.native_id),
                  "nice": os.getpriority(os.PRIO_PROCESS, thread.native_id),
                  "own_nice": os.getpriority(os.PRIO_PROCESS, 0)}))
done.set()
"""

CLAIM = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
from ray_resilience._internal.rank import preimport
import time
preimport.start_preimport(modules=("slow_module",))
while "policy" not in preimport.stats:  # the thread lowered itself: claim mid-import
    time.sleep(0.01)
waited = preimport.claim()
import slow_module
print(json.dumps({"waited": waited, "raised": preimport.stats.get("raised"),
                  "policy_at_start": preimport.stats.get("policy"),
                  "policy_at_end": slow_module.POLICY_AT_END}))
"""

SLOW_MODULE = """
import os, time
time.sleep(1.0)  # the claim comes meanwhile
POLICY_AT_END = os.sched_getscheduler(0)
"""


def _child(code: str, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _may_raise_priority() -> bool:
    """Leaving SCHED_IDLE needs CAP_SYS_NICE (root has it) or a large enough RLIMIT_NICE."""
    import resource  # noqa: PLC0415 - Linux only, like the tests using it

    return os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20


@pytest.mark.timeout(60)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread priorities: Linux")
def test_restore_puts_an_idle_thread_back_at_the_callers_priority():
    got = _child(RESTORE)
    assert got["before"] == os.SCHED_IDLE
    if not _may_raise_priority():
        assert got == {**got, "ok": False, "policy": os.SCHED_IDLE}
        return
    assert got["ok"] is True and got["policy"] == os.SCHED_OTHER
    assert got["nice"] == got["own_nice"]


@pytest.mark.timeout(60)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread priorities: Linux")
def test_a_rank_claiming_an_unfinished_preimport_raises_it_to_its_own_priority(tmp_path):
    # Without the raise the rest of the import ran at SCHED_IDLE while a recovery waited on it.
    (tmp_path / "slow_module.py").write_text(SLOW_MODULE)
    got = _child(CLAIM, str(tmp_path))
    assert got["policy_at_start"] == "idle" and got["waited"] > 0.5
    if not _may_raise_priority():
        assert got["raised"] is False and got["policy_at_end"] == os.SCHED_IDLE
        return
    assert got["raised"] is True and got["policy_at_end"] == os.SCHED_OTHER
