"""Node loss on a simulated 3-node cluster (ray.cluster_utils): the run completes bit-equal.

The cluster runs in a subprocess: one process can only be connected to one Ray cluster, and
the rest of the suite shares the session's local Ray.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from ray_resilience._internal.calls import ACTOR_GONE
from ray_resilience._internal.checkpoint.rank.export import writer_failed
from ray_resilience._internal.checkpoint.wire import SaveTicket

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(mode: str, data_dir: str, storage: str, clean=None) -> dict:
    """Runs tests/support/node_loss_run.py; `clean` (a fault-free Result of the session's local Ray,
    the same workload) is handed over as a file of final weights, the oracle of the run."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = ROOT
    args = [data_dir, storage, mode]
    if clean is not None:
        reference = os.path.join(os.path.dirname(storage), "clean_states.pt")
        torch.save([v["state"] for v in clean.return_values], reference)
        args.append(reference)
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "support", "node_loss_run.py"), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1])


class _Pinned:
    def ping(self) -> int:
        return os.getpid()


@pytest.mark.timeout(120)
def test_a_call_to_an_actor_pinned_to_a_gone_node_counts_as_a_gone_actor(ray_session):
    """Writers and node agents are pinned (hard) to their node. Once that node is gone, Ray
    cannot place them and a call raises ActorUnschedulableError, which is no RayActorError: a
    save that meets it fails as a dead writer's does (the writer is replaced), not as an
    unexpected error that ends the run."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: PLC0415

    gone = ray_session.NodeID.from_random().hex()
    actor = ray_session.remote(_Pinned).options(
        num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(gone, soft=False)).remote()
    with pytest.raises(ACTOR_GONE) as caught:
        ray_session.get(actor.ping.remote(), timeout=60)
    replaced = []
    ticket = SaveTicket(session="s", step=4, rank=1, world_size=2, items=None, owned=[],
                        planner_data=None, staged_at=0.0)
    outcome = writer_failed(ticket, "writer-gone", caught.value, lambda: replaced.append(True))
    assert replaced == [True], "a writer on a gone node must be replaced"
    assert not outcome.ok and "writer-gone died" in outcome.error, outcome


@pytest.mark.slow  # ~75 s: a 3-node cluster of its own in a subprocess
@pytest.mark.timeout(420)
def test_node_removed_without_grace_during_training(clean_run, token_data_dir, tmp_path):
    out = _run("replace", token_data_dir, str(tmp_path / "store"), clean_run(2, 12))
    assert out["ok"], out["error"]
    assert out["log"]["step_at_removal"] < 12, f"the node went after the run's end: {out['log']}"
    assert out["log"]["removed_node"] and "added_at" in out["log"]
    assert out["faults"], "the node loss was not detected"
    assert out["bit_equal"], "final weights differ from the fault-free run"
    # memory_replicas=1: the node was removed once both ranks' shards of the newest commit had a
    # replica on the other node's writer, so the rank that moved restores from memory although
    # its own writer died with the node (from storage only if a newer step committed between
    # that check and the removal: no replica of it may exist yet).
    # The node loss's fault is the first detected after the removal that respawned a rank (a
    # loaded machine may have produced an earlier one, e.g. a rank silent past the 3 s heartbeat
    # timeout at start-up; and the survivor's gloo error can come first, answered in-process
    # before the lost rank's death is seen).
    fault = next(f for f in out["faults"]
                 if f["t_detect"] >= out["log"]["removed_at"] and f["respawned"])
    (moved,) = fault["respawned"]
    # Its new node had no writer: one started while the moved rank started there.
    assert [(r["rank"], r["node_prepared"]) for r in fault["replacements"]] == [(moved, True)]
    recovery = [load for load in out["loads"]
                if load["attempt"] > fault["attempt"] and load["rank"] == moved]
    assert recovery, out["loads"]
    load = recovery[0]
    replicated = out["log"]["replicated_step"]
    assert (load["tier"], load["replica"], load["step"]) == ("memory", True, replicated) \
        or (load["tier"] == "storage" and load["step"] > replicated), (load, out["log"])
    # The recovery's load is the moved rank's (the slowest), named by the tier it read.
    tier = "replica" if load["replica"] else load["tier"]
    assert tier in out["restore_s"], out["restore_s"]
    # A detected fault's record in the goodput report is "fault<n>-a<attempt>", n counting
    # `Result.faults` from 1.
    fault_id = f"fault{out['faults'].index(fault) + 1}-a{fault['attempt']}"
    (recovered,) = [f for f in out["recoveries"] if f["fault_id"] == fault_id]
    assert recovered["checkpoint_tier"] == tier, (recovered, load)


@pytest.mark.slow  # ~75 s: a 3-node cluster of its own in a subprocess
@pytest.mark.timeout(420)
def test_node_lost_before_the_first_commit_starts_over_bit_equal(clean_run, token_data_dir,
                                                                  tmp_path):
    """Nothing committed yet: every rank starts over from the seed, while the survivor's node
    still holds its local snapshots (offered, never common). The fresh start must train exactly
    as the fault-free run: offering a snapshot reads the optimizer's state dict, which makes
    torch create its state, and a fresh start that kept it diverged."""
    out = _run("fresh", token_data_dir, str(tmp_path / "store"), clean_run(2, 12))
    assert out["ok"], out["error"]
    fault = next(f for f in out["faults"] if f["t_detect"] >= out["log"]["removed_at"])
    starts = [load for load in out["loads"] if load["attempt"] > fault["attempt"]]
    assert starts and all(load["step"] is None for load in starts), out["loads"]
    assert out["bit_equal"], "final weights differ from the fault-free run"


@pytest.mark.slow  # 1.5-5 min: after a node dies, Ray's agents on the simulated cluster spin
@pytest.mark.timeout(420)
def test_lost_node_without_capacity_shrinks_to_min_workers(token_data_dir, tmp_path):
    out = _run("shrink", token_data_dir, str(tmp_path / "store"))
    assert out["ok"], out["error"]
    assert out["final_step"] == 12 and out["num_returns"] == 1
    assert out["faults"], "the node loss was not detected"


@pytest.mark.slow  # ~1.5 min: a 4-node simulated cluster, a twice-faulted run
@pytest.mark.timeout(420)
def test_node_that_keeps_failing_is_excluded_and_its_rank_moves(clean_run, token_data_dir,
                                                                tmp_path):
    out = _run("exclude", token_data_dir, str(tmp_path / "store"), clean_run(2, 12))
    assert out["ok"], out["error"]
    first, second = out["faults"]
    assert first["cause"] == second["cause"] == "actor_died" and first["ranks"] == [1]
    assert first["excluded_nodes"] == [] and first["nodes"] == second["nodes"]  # same node twice
    assert second["excluded_nodes"] == second["nodes"]  # excluded at the second fault
    assert out["final_nodes"][1] not in second["nodes"], out  # rank 1 moved away
    # Killed on its own node, rank 1 came back there (its writer runs); moved, it went to a
    # node with no writer, whose writer started while rank 1 started.
    assert [r["node_prepared"] for r in first["replacements"]] == [False], first
    assert [r["node_prepared"] for r in second["replacements"]] == [True], second
    assert out["bit_equal"], "final weights differ from the fault-free run"
