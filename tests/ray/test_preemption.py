"""Preemption: SIGTERM to the `ray start` of a node hosting a rank (what Kubernetes sends a pod
on a spot reclaim; Ray 2.60 then drains the node) makes every rank save one agreed step and
stop; the rank moves to another node and the run resumes from that step, with no step trained
twice, ending bit-equal to the fault-free run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # ~3.5 min: adds a `ray start` node to a running cluster
@pytest.mark.timeout(720)
def test_sigterm_to_a_ranks_node_saves_a_step_and_loses_none(clean_run, token_data_dir,
                                                              tmp_path):
    reference = str(tmp_path / "clean_states.pt")
    torch.save([v["state"] for v in clean_run(2, 20).return_values], reference)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = ROOT
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "support", "preemption_run.py"),
         token_data_dir, str(tmp_path / "store"), reference],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=690)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    out = json.loads(lines[-1])
    assert out["ok"], out["error"]
    (fault,) = out["faults"]
    # SPREAD puts one rank on the node that gets SIGTERM; which one is Ray's choice.
    assert fault["cause"] == "preempted" and len(fault["ranks"]) == 1, fault
    (moved,) = fault["ranks"]
    assert fault["nodes"] == [out["log"]["victim"]] == fault["excluded_nodes"]
    assert out["nodes"][moved] != out["log"]["victim"]  # it finished on another node
    stopped = fault["step"]
    assert stopped > out["log"]["sigterm_step"]
    # Zero steps redone: every (step, rank) once, and the resume loaded the step both saved.
    counts = Counter(tuple(x) for x in out["history"])
    assert set(counts) == {(s, r) for s in range(1, 21) for r in range(2)}
    assert set(counts.values()) == {1}, [k for k, n in counts.items() if n > 1]
    resumed = [load for load in out["loads"] if load["attempt"] == 1]
    assert {load["step"] for load in resumed} == {stopped}, out["loads"]
    assert out["bit_equal"], "final weights differ from the fault-free run"
