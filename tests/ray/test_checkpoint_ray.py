"""Checkpoints end to end on a local Ray: FSDP2 ranks (gloo), real writer actors, local storage.

Oracles: a checkpoint holds exactly the state at save time (the parameters are changed right
after `save` returns); plain `torch.distributed.checkpoint.load` reads it at world sizes 1, 2 and
3; a resumed run ends bit-equal to an uninterrupted one; loads name their tier and fall back past
damaged steps, naming the file.
"""

from __future__ import annotations

import os
import time
import warnings

import pytest
import ray
import torch
import torch.distributed.checkpoint as dcp

from ray_resilience._internal.checkpoint.format.extra_codec import encode_extra
from ray_resilience._internal.checkpoint.format.local_roots import node_root
from ray_resilience._internal.checkpoint.rank.snapshot import StagingBuffers, state_dict_of
from ray_resilience._internal.checkpoint.rank.state_cache import StateCache
from ray_resilience._internal.checkpoint.service.service import CheckpointService
from ray_resilience._internal.checkpoint.service.warm_import import dumps
from ray_resilience._internal.checkpoint.service.writer_pool import object_store_bytes
from ray_resilience._internal.checkpoint.wire import NEED_PLAN, SaveTicket
from ray_resilience.checkpoint.config import CheckpointConfig
from ray_resilience.examples.llama import build_model
from tests.support.checkpoint_harness import on_all, start_ranks, start_with, stop_ranks
from tests.support.checkpoint_service import assert_same, start_service, step_folder, wait_committed
from tests.support.gated_fs import gated_filesystem
from tests.support.procfs import (
    SCHED_BATCH,
    SCHED_IDLE,
    SCHED_OTHER,
    thread_nices,
    thread_policies,
)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def two_ranks(ray_session, tmp_path):
    """A service and two ranks that trained 3 steps, saved step 3, then changed every value."""
    service, ranks = start_with(lambda: start_service(str(tmp_path), 2))
    on_all(ranks, "train", 3, save=False)
    expected = on_all(ranks, "save_then_mutate", 3)[0]
    assert all(on_all(ranks, "wait_idle"))
    wait_committed(service, 3)
    yield service, ranks, expected
    stop_ranks(ranks)
    service.shutdown()


def test_checkpoint_is_an_exact_snapshot_loadable_by_plain_dcp(two_ranks, tmp_path):
    service, ranks, expected = two_ranks
    model = build_model("tiny", seed=7)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = state_dict_of(model, optimizer)  # materializes the optimizer state to load into
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=step_folder(str(tmp_path), "run", 3))
    got = {f"model.{k}": v for k, v in state["model"].items()}
    for fqn, entry in state["optimizer"]["state"].items():
        got.update({f"optimizer.state.{fqn}.{k}": v for k, v in entry.items()})
    assert_same(expected, got)


def test_loading_restores_values_and_extra_from_memory(two_ranks):
    service, ranks, expected = two_ranks
    loaded = on_all(ranks, "load")
    assert [(r["step"], r["tier"]) for r in loaded] == [(3, "memory"), (3, "memory")]
    assert loaded[1]["extra"]["note"] == ("rank", 1) and loaded[0]["extra"]["step"] == 3
    assert loaded[0]["extra"]["rng"].dtype == torch.uint8
    assert_same(expected, on_all(ranks, "full_state")[0])
    stats = service.stats()
    assert stats["committed_steps"] == [3] and stats["memory_bytes"] > 0


def test_a_closed_checkpointer_lets_its_staging_memory_go_at_once(ray_session, tmp_path):
    """Closing a checkpointer unmaps its snapshot slots and spares right away, without waiting
    for Python's cycle collector: an in-process restart's new checkpointer would otherwise
    allocate its slots beside the old ones (at GBs per rank, twice the staging memory)."""
    service, ranks = start_with(lambda: start_service(str(tmp_path), 2, interval_steps=1))
    try:
        for _ in range(3):
            on_all(ranks, "train", 1)
            assert all(on_all(ranks, "wait_idle"))
        assert all(n > 0 for n in on_all(ranks, "shared_mapped_bytes"))  # slots, spares
        assert on_all(ranks, "close_checkpointer") == [0, 0]
    finally:
        stop_ranks(ranks)
        service.shutdown()


def test_saves_travel_in_shared_memory_the_writer_adopts_and_gives_back(ray_session, tmp_path):
    """Every save's shared staging slot is adopted by the writer (no copy), which keeps the memory
    tier in it and gives a buffer back to its rank once a newer commit replaced it: after the
    first saves, a save reuses memory instead of touching new. Nothing a rank holds aliases the
    memory tier. A load maps the memory tier from the writer and gives it back; a rank on
    another node gets an object instead."""
    service, ranks = start_with(lambda: start_service(str(tmp_path), 2, interval_steps=1))
    try:
        for step in range(1, 6):
            on_all(ranks, "train", 1)
            assert all(on_all(ranks, "wait_idle"))
            wait_committed(service, step)
        expected = on_all(ranks, "save_then_mutate", 6)[0]
        assert all(on_all(ranks, "wait_idle"))
        wait_committed(service, 6)
        writers = service.stats()["writers"]
        pools = [w["buffers"] for w in writers]
        assert sum(p["leased"] for p in pools) == 12, pools  # 6 saves of 2 ranks
        # Each writer adopted its rank's shared slot: no copy anywhere, no object, no buffer of
        # its own.
        assert sum(w["adopted"] for w in writers) == 12, writers
        assert not any(w["pulled"] or w["filled"] or w["copied"] or w["unmapped"]
                       for w in writers), writers
        assert sum(p["created"] for p in pools) == 0, pools
        deadline = time.monotonic() + 60
        while sum(w["spares_given"] for w in service.stats()["writers"]) < 2:
            assert time.monotonic() < deadline, service.stats()["writers"]
            time.sleep(0.05)
        ranks_stats = on_all(ranks, "stats")
        assert all(r["spares_taken"] >= 1 for r in ranks_stats), ranks_stats
        # Whatever shared memory a rank holds now (a spare, a free slot), the memory tier is
        # elsewhere: scribbling over all of it leaves the loaded state intact.
        assert all(n > 0 for n in on_all(ranks, "scribble_own_memory"))

        loaded = on_all(ranks, "load")
        assert [(r["step"], r["tier"]) for r in loaded] == [(6, "memory"), (6, "memory")]
        assert_same(expected, on_all(ranks, "full_state")[0])
        deadline = time.monotonic() + 60
        while any(w["lent"] for w in service.stats()["writers"]):  # the loaders give it back
            assert time.monotonic() < deadline, service.stats()["writers"]
            time.sleep(0.05)
        writers = service.stats()["writers"]
        assert sum(w["memory_mapped"] for w in writers) == 2, writers  # no copy for a load here
        assert not any(w["memory_objects"] for w in writers)

        spec = service.rank_spec(0)
        session = os.path.basename(step_folder(str(tmp_path), "run", 6)).split("_")[-1]
        here = ray.get_runtime_context().get_node_id()
        mapped = ray.get(spec.writer.memory_entry.remote(0, session, 6, here))
        assert mapped.shm is not None and not mapped.boxed and mapped.lent
        ray.get(spec.writer.return_lent.remote(mapped.lent))
        elsewhere = ray.get(spec.writer.memory_entry.remote(0, session, 6, "another-node"))
        assert elsewhere.shm is None and elsewhere.lent is None
        copy = ray.get(elsewhere.boxed[0])
        assert copy.nbytes == mapped.nbytes and copy.extra == mapped.shm[1].extra
        # memory_budget_bytes=None: the tier is held to the node's object store size.
        assert object_store_bytes(here) > 0 and object_store_bytes("no-such-node") is None
    finally:
        stop_ranks(ranks)
        service.shutdown()


@pytest.mark.slow  # ~12 s; the local-tier test below restores killed ranks from writer memory
def test_respawned_ranks_load_from_writer_memory(two_ranks):
    service, ranks, expected = two_ranks
    stop_ranks(ranks, kill=True)  # the writers' memory must outlive the ranks' processes
    fresh = start_ranks(service.ensure_writers([ray.get_runtime_context().get_node_id()] * 2))
    try:
        assert [r["tier"] for r in on_all(fresh, "load")] == ["memory", "memory"]
        assert_same(expected, on_all(fresh, "full_state")[0])
    finally:
        stop_ranks(fresh)


@pytest.mark.timeout(120)
def test_writers_started_ahead_for_a_node_are_the_ones_its_ranks_get(ray_session, tmp_path):
    """A respawned rank moving to a node with no writer: `prelaunch` starts that node's writer
    while the rank starts; `ensure_writers` hands it to the coordinator, which adopts it (no
    second writer); one started for a node no rank reached is stopped."""
    node = ray.get_runtime_context().get_node_id()
    service = start_service(str(tmp_path), 0)  # no rank yet: no writer anywhere
    try:
        service.prelaunch(node)
        service.prelaunch(node)  # once per node, however often a rank is announced there
        (launched_id, handle), = service._launched.values()
        specs = service.ensure_writers([node, node])
        assert [s.writer_id for s in specs] == [launched_id, launched_id]
        assert ray.get(specs[0].writer.ping.remote(), timeout=60)["writer_id"] == launched_id
        assert [w["writer_id"] for w in service.stats()["writers"]] == [launched_id]
        service.prelaunch(node)  # the node has its writer now: nothing more starts
        assert service._launched == {}
    finally:
        service.shutdown()
    # Started for a node no rank reached (the rank moved on again), or left at the run's end:
    # stopped either way.
    for run, end in (("moved-on", lambda s: s.ensure_writers([])), ("ended", lambda s: None)):
        service = start_service(str(tmp_path), 0, run=run)
        try:
            service.prelaunch(node)
            ((_, unused),) = service._launched.values()
            end(service)
        finally:
            service.shutdown()
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(unused.ping.remote(), timeout=60)


def test_local_tier_restores_the_newest_step_across_a_respawn_and_falls_back(ray_session, tmp_path):
    node = ray.get_runtime_context().get_node_id()
    service, ranks = start_with(lambda: start_service(str(tmp_path), 2, interval_steps=4,
                                                      local_interval_steps=1))
    fresh = []
    try:
        on_all(ranks, "train", 4)
        at_4 = on_all(ranks, "full_state")[0]
        on_all(ranks, "train", 2)  # committed: step 4; local: steps 5 and 6
        at_6 = on_all(ranks, "full_state")[0]
        assert all(on_all(ranks, "wait_idle"))
        wait_committed(service, 4)
        on_all(ranks, "train", 1, save=False)  # step 7 changes everything, no snapshot of it
        loaded = on_all(ranks, "load")
        assert [(r["step"], r["tier"]) for r in loaded] == [(6, "local"), (6, "local")]
        assert loaded[1]["extra"]["note"] == ("rank", 1) and loaded[0]["extra"]["step"] == 6
        assert_same(at_6, on_all(ranks, "full_state")[0])
        stats = on_all(ranks, "stats")
        assert stats[0]["local_snapshots"] == 6 and stats[0]["local_bytes"] > 0
        assert stats[0]["local_disabled"] is None

        # The writer took every snapshot from its rank (objects it owns), copying none.
        writers = service.stats()["writers"]
        assert sum(w["received"] for w in writers) >= 2 and not any(w["copied"] for w in writers)
        # SIGKILL both processes: the files outlive them, new processes on the node read them.
        stop_ranks(ranks, kill=True)
        fresh = start_ranks(service.ensure_writers([node] * 2))
        loaded = on_all(fresh, "load")
        assert [(r["step"], r["tier"]) for r in loaded] == [(6, "local"), (6, "local")]
        assert_same(at_6, on_all(fresh, "full_state")[0])

        # Rank 1's snapshot damaged: no step both ranks hold, so both load the committed step.
        for name in ("rank1.0", "rank1.1"):
            path = os.path.join(node_root(service.local_root, node), name)
            if os.path.exists(path):
                with open(path, "r+b") as f:
                    f.write(b"\xff" * 64)
        loaded = on_all(fresh, "load")
        assert [(r["step"], r["tier"]) for r in loaded] == [(4, "memory"), (4, "memory")]
        assert_same(at_4, on_all(fresh, "full_state")[0])
        root = node_root(service.local_root, node)
        assert not any(f.startswith("rank0.") and _complete(os.path.join(root, f))
                       for f in os.listdir(root))  # the abandoned timeline's files
    finally:
        stop_ranks(fresh or ranks)
        service.shutdown()
    assert not os.path.exists(root)  # the run's writers removed its local folder


def _complete(path: str) -> bool:
    with open(path, "rb") as f:
        return b'"state":"complete"' in f.read(4096)


def test_replica_restores_a_rank_whose_writer_is_gone(ray_session, tmp_path):
    """memory_replicas=1, one writer per rank: each writer also keeps the other rank's shard.
    With rank 1's writer killed after the commit, rank 1 restores from the replica in rank 0's
    writer, not from storage; the values are the ones saved."""
    service, ranks = start_with(lambda: start_service(str(tmp_path), 2, writers_per_node=2,
                                                      memory_replicas=1))
    try:
        on_all(ranks, "train", 3, save=False)
        expected = on_all(ranks, "save_then_mutate", 3)[0]
        assert all(on_all(ranks, "wait_idle"))
        wait_committed(service, 3)
        deadline = time.monotonic() + 60
        while True:
            writers = service.stats()["writers"]
            held = sorted(((w.get("memory_tier_steps"), w.get("replica_steps")) for w in writers),
                          key=repr)
            if held == [({0: 3}, {1: 3}), ({1: 3}, {0: 3})]:
                break
            assert time.monotonic() < deadline, f"replicas not held: {writers}"
            time.sleep(0.1)
        assert service.stats()["memory_bytes"] >= 2 * sum(w["memory_tier_bytes"] for w in writers)
        # An older commit's broadcast that runs late (the writer is a threaded actor) drops nothing.
        ray.get(service.rank_spec(0).writer.on_commit.remote("0" * 16, 1, 0, {}))
        after = {w["writer_id"]: (w["memory_tier_steps"], w["replica_steps"])
                 for w in service.stats()["writers"]}
        assert after[service.rank_spec(0).writer_id] == ({0: 3}, {1: 3}), after
        ray.kill(service.rank_spec(1).writer)
        loaded = on_all(ranks, "load")
        assert [(r["step"], r["tier"], r["replica"]) for r in loaded] == [
            (3, "memory", False), (3, "memory", True)]
        assert_same(expected, on_all(ranks, "full_state")[0])
    finally:
        stop_ranks(ranks)
        service.shutdown()


@pytest.mark.slow  # ~20 s; shrinking is covered by tests/unit resharding tests
def test_resharding_to_one_and_three_ranks_with_plain_dcp(two_ranks, tmp_path):
    service, ranks, expected = two_ranks
    stop_ranks(ranks)
    path = step_folder(str(tmp_path), "run", 3)
    three = start_ranks([], world_size=3)
    try:
        states = on_all(three, "stock_load", path)
        for state in states:
            assert_same(expected, state)
    finally:
        stop_ranks(three)


def test_resumed_run_ends_bit_equal_to_an_uninterrupted_one(ray_session, tmp_path):
    service, ranks = start_with(lambda: start_service(str(tmp_path), 2, interval_steps=4))
    try:
        assert on_all(ranks, "load") == [None, None]
        blocked = on_all(ranks, "train", 8)
        assert [b is not None for b in blocked[0]] == [s % 4 == 0 for s in range(1, 9)]
        assert all(on_all(ranks, "wait_idle"))
        wait_committed(service, 8)
        on_all(ranks, "train", 3, save=False)
        uninterrupted = on_all(ranks, "full_state")[0]
    finally:
        stop_ranks(ranks)
    service.shutdown()
    # A job retry: new service (no memory tier survives), new processes, same run folder.
    service, ranks = start_with(lambda: start_service(str(tmp_path), 2, interval_steps=4))
    try:
        loaded = on_all(ranks, "load")
        assert [(r["step"], r["tier"]) for r in loaded] == [(8, "storage"), (8, "storage")]
        on_all(ranks, "train", 3, save=False)
        assert_same(uninterrupted, on_all(ranks, "full_state")[0])
    finally:
        stop_ranks(ranks)
        service.shutdown()


@pytest.mark.parametrize("damage", [
    "corrupt", pytest.param("missing", marks=pytest.mark.slow)])  # ~7 s; the same fallback
def test_damaged_newest_step_falls_back_naming_the_file(ray_session, tmp_path, damage):
    service, ranks = start_with(
        lambda: start_service(str(tmp_path), 2, interval_steps=2, memory_tier=False))
    try:
        on_all(ranks, "train", 2)
        assert all(on_all(ranks, "wait_idle"))
        wait_committed(service, 2)
        at_step_2 = on_all(ranks, "full_state")[0]
        on_all(ranks, "train", 2)
        assert all(on_all(ranks, "wait_idle"))
        wait_committed(service, 4)
        shard = os.path.join(step_folder(str(tmp_path), "run", 4), "__1_0.distcp")
        if damage == "missing":
            os.remove(shard)
        else:
            with open(shard, "r+b") as f:
                f.seek(200)
                f.write(b"\x00garbage\x00")
        loaded = on_all(ranks, "load")
        assert [r["step"] for r in loaded] == [2, 2]
        for r in loaded:  # every rank names the damaged file, whichever rank read it
            assert len(r["fallbacks"]) == 1 and shard in r["fallbacks"][0]
        assert_same(at_step_2, on_all(ranks, "full_state")[0])
    finally:
        stop_ranks(ranks)
        service.shutdown()


def test_a_writer_imports_dcp_only_once_told_to(ray_session, tmp_path):
    """Importing torch costs a writer ~2 CPU-seconds, which would slow the ranks' own start-up:
    a new writer defers it until `warm` (the supervisor calls it after the first step)."""
    service = start_service(str(tmp_path), 1, interval_steps=1)
    try:
        writer = service.rank_spec(0).writer
        time.sleep(1.0)  # the writer is up; nothing started its import
        assert ray.get(writer.ping.remote(), timeout=60)["dcp_import"] == "deferred"
        service.warm()
        deadline = time.monotonic() + 60
        while ray.get(writer.ping.remote(), timeout=60)["dcp_import"] != "done":
            assert time.monotonic() < deadline, "the writer never finished importing DCP"
            time.sleep(0.1)
        stats = service.stats()["writers"]
        assert [w["dcp_import"] for w in stats] == ["done"]
        assert stats[0]["dcp_import_started_at"] is not None
    finally:
        service.shutdown()


def test_retention_keeps_num_to_keep_committed_steps(ray_session, tmp_path):
    service, ranks = start_with(lambda: start_service(
        str(tmp_path), 2, interval_steps=1, num_to_keep=2, in_flight_policy="block"))
    try:
        service.wait_ready(timeout_s=60)  # the writer imported DCP
        on_all(ranks, "train", 5)
        assert all(on_all(ranks, "wait_idle"))
        wait_committed(service, 5)
        root = os.path.join(str(tmp_path), "run", "checkpoints")
        deadline = time.monotonic() + 30  # pruning follows the commit
        while len(os.listdir(root)) > 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sorted(int(n.split("_")[1]) for n in os.listdir(root)) == [4, 5]
        counts = on_all(ranks, "stats")[0]
        assert counts["staged"] == 5 and counts.get("skipped", 0) == 0
        stats = service.stats()
        assert stats["counts"]["committed"] == 5 and not stats["coordinator_has_torch"], stats
    finally:
        stop_ranks(ranks)
        service.shutdown()


def test_a_writer_missing_the_plan_asks_for_it_and_later_tickets_leave_it_out(ray_session,
                                                                               tmp_path):
    """A rank sends its save plan (every item, the planner data) to a writer once; later tickets
    carry only the plan's id. A writer that does not hold the plan (a replacement, or a new
    plan) answers NEED_PLAN and takes nothing; once it holds it, a lean ticket's shard is
    written with every item. Each shard is awaited before the next is sent, as a rank does (one
    in flight per rank): a writer drops a rank's unfinished shard when a newer one arrives."""
    service = start_service(str(tmp_path), 1)
    try:
        writer = service.rank_spec(0).writer
        model = build_model("tiny", seed=0)
        source = StateCache().source(model, None)
        buffers = StagingBuffers(source.items, source.tensors)
        buffers.copy_now(source.tensors, list(range(len(source.tensors))))
        session = "00000000000000cc"

        def ticket(step: int, *, lean: bool) -> bytes:
            return dumps(SaveTicket(session=session, step=step, rank=0, world_size=1,
                                    items=None if lean else source.items,
                                    owned=[True] * len(source.items),
                                    planner_data=None if lean else source.planner_data,
                                    staged_at=time.time(), plan_id=source.plan_id))

        def send(step: int, *, lean: bool):
            ref = ray.put(buffers.payload(source.blobs, encode_extra({"step": step})))
            return ray.get(writer.receive.remote(ticket(step, lean=lean), [ref]), timeout=60)

        assert send(1, lean=True) == NEED_PLAN
        assert ray.get(writer.stats.remote())["received"] == 0  # nothing taken
        for step, lean in ((1, False), (2, True)):  # step 2: the writer fills in the plan
            assert send(step, lean=lean) is None
            outcome = ray.get(writer.wait.remote((session, step, 0), 60.0), timeout=90)
            assert outcome is not None and outcome.ok, outcome
        assert ray.get(writer.stats.remote())["received"] == 2
        assert ray.get(writer.stats.remote())["copied"] == 2  # the driver's objects: copied
        # The lean ticket's shard holds every item, as the full one's does.
        sizes = [os.path.getsize(os.path.join(step_folder(str(tmp_path), "run", step),
                                              "__0_0.distcp")) for step in (1, 2)]
        assert sizes[0] == sizes[1] > buffers.nbytes, sizes
    finally:
        service.shutdown()


def test_a_save_superseded_while_unfinished_is_answered_as_not_saved(ray_session, tmp_path):
    """A writer given a rank's newer save while the older one is still being written drops the
    older one and answers its waiter at once (not saved, and why) instead of leaving it to wait
    out write_timeout_s; the older write, once it ends, gives no second answer; the newer save
    is written and answered as durable. The storage holds every file write while a gate file
    exists, and the newer save is sent only once the older one's write waits at the gate."""
    gate = tmp_path / "gate"
    service = CheckpointService.start(
        storage_path=str(tmp_path / "ckpt"), run_name="run",
        storage_filesystem=gated_filesystem(str(gate)), world_size=1,
        node_ids_by_rank=[ray.get_runtime_context().get_node_id()],
        config=CheckpointConfig(local_interval_steps=0))
    try:
        writer = service.rank_spec(0).writer
        service.wait_ready()
        model = build_model("tiny", seed=0)
        source = StateCache().source(model, None)
        buffers = StagingBuffers(source.items, source.tensors)
        buffers.copy_now(source.tensors, list(range(len(source.tensors))))
        session = "00000000000000dd"

        def send(step: int):
            ticket = SaveTicket(session=session, step=step, rank=0, world_size=1,
                                items=source.items, owned=[True] * len(source.items),
                                planner_data=source.planner_data, staged_at=time.time(),
                                plan_id=source.plan_id)
            ref = ray.put(buffers.payload(source.blobs, encode_extra({"step": step})))
            return ray.get(writer.receive.remote(dumps(ticket), [ref]), timeout=60)

        gate.touch()
        assert send(1) is None
        deadline = time.monotonic() + 60
        while not (tmp_path / "gate.waiting").exists():
            assert time.monotonic() < deadline, "step 1's write never reached the storage"
            time.sleep(0.05)
        assert send(2) is None
        first = ray.get(writer.wait.remote((session, 1, 0), 30.0), timeout=60)
        assert first is not None and not first.ok, first
        assert "superseded" in first.error and "step 2" in first.error, first.error
        gate.unlink()
        second = ray.get(writer.wait.remote((session, 2, 0), 60.0), timeout=90)
        assert second is not None and second.ok, second
        deadline = time.monotonic() + 60
        while ray.get(writer.stats.remote(), timeout=60)["durable"] < 2:  # step 1's write too
            assert time.monotonic() < deadline, ray.get(writer.stats.remote(), timeout=60)
            time.sleep(0.05)
        assert ray.get(writer.wait.remote((session, 1, 0), 0.5), timeout=60) is None
        assert ray.get(writer.stats.remote(), timeout=60)["superseded"] == 1
    finally:
        gate.unlink(missing_ok=True)
        service.shutdown()


def test_a_ranks_checkpoint_threads_never_preempt_its_training_thread(two_ranks):
    """The threads a save wakes (copier, rounds, writer replies) run under SCHED_BATCH (3): the
    same share of the CPU, but waking them from inside `save` does not preempt the training
    thread, which keeps Ray's SCHED_OTHER (0)."""
    _, ranks, _ = two_ranks
    policies = ray.get(ranks[0].thread_policies.remote(), timeout=60)
    ours = {name: policy for name, policy in policies.items() if name.startswith("rr-ckpt-")}
    assert sorted(ours) == ["rr-ckpt-copy-r0", "rr-ckpt-rounds-r0", "rr-ckpt-wait-r0"], policies
    assert set(ours.values()) == {SCHED_BATCH} and policies["caller"] == SCHED_OTHER, policies


@pytest.mark.parametrize("policy, job_nice, expected", [
    ("coalesce", None, ("nice", SCHED_BATCH, 11)),  # ranks at 0, writers 11 levels below
    ("block", None, ("normal", SCHED_OTHER, 0)),
    ("coalesce", "15", ("idle", SCHED_IDLE, None)),  # a job that keeps Ray's nice 15
])
def test_writers_run_below_the_ranks_unless_training_waits_for_them(ray_session, tmp_path, policy,
                                                                    job_nice, expected,
                                                                    monkeypatch):
    """Writers start at the ranks' nice value (0 unless the job sets `RAY_worker_niceness`) and
    every thread goes 11 levels below it, or to SCHED_IDLE where that passes 19; under `block`
    training waits for the writer, which keeps the ranks' priority."""
    if job_nice is not None:  # the job's runtime env, as the supervisor would see it
        monkeypatch.setenv("RAY_worker_niceness", job_nice)
    service = start_service(str(tmp_path), 1, in_flight_policy=policy)
    try:
        writer = service.rank_spec(0).writer
        service.wait_ready()  # the one-time import thread (kept at the ranks' priority) is done
        info = ray.get(writer.ping.remote(), timeout=60)
        policies, nices = thread_policies(info["pid"]), thread_nices(info["pid"])
        # A nice value means nothing under SCHED_IDLE (some of Ray's threads keep 0 there).
        found = {(info["priority"], policies[t], None if policies[t] == SCHED_IDLE else nices[t])
                 for t in policies if t in nices}
        assert found == {expected}, found
    finally:
        service.shutdown()
