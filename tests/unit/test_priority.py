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
