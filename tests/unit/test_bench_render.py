"""docs/benchmarks.md is rendered from the committed result files, never edited by hand: the
committed page must be exactly what the renderer produces from them; the template prose must
say where ours loses, with the numbers of the results."""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys

import pytest

from ray_resilience.goodput import RunTimeline

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "jobs", "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import render  # noqa: E402 - after the path set-up above
from report import checkpoint, overhead, prose, rebuild, recovery, targets  # noqa: E402

pytestmark = pytest.mark.timeout(60)

RESULTS = os.path.join(ROOT, "docs", "benchmarks")
PAGE = os.path.join(ROOT, "docs", "benchmarks.md")


def test_the_committed_page_is_what_the_committed_results_render_to() -> None:
    assert os.path.isdir(RESULTS), "docs/benchmarks/ holds the results behind the page"
    with open(PAGE, encoding="utf-8") as f:
        committed = f.read()
    assert render.render(RESULTS) == committed
    assert render.render(RESULTS) == render.render(RESULTS)  # deterministic


def test_the_readme_block_is_replaced_only_between_its_markers() -> None:
    text = f"intro\n{render.START}\nold table\n{render.END}\noutro\n"
    assert render.replace_block(text, "new") == f"intro\n{render.START}\nnew\n{render.END}\noutro\n"
    assert render.replace_block("no markers here\n", "new") is None
    assert render.replace_block(f"{render.END}\n{render.START}\n", "new") is None


def _summary(goodput: float, wall: float, exception_p50: float, sigkill_p50: float) -> dict:
    def one(x: float) -> dict:
        return {"median": x, "min": x, "max": x, "n": 1}
    return {"ok": 1, "runs": 1, "statuses": ["ok"], "errors": [], "faults_planned": 2,
            "training_goodput": one(goodput), "wall_s": one(wall), "startup_s": one(5.0),
            "goodput_after_startup": one(goodput), "infra_goodput_per_slot": one(0.8),
            "in_run_goodput": one(0.9), "steps_redone": one(0), "recovery_total_s":
            one(exception_p50 + sigkill_p50), "useful_steps": one(100), "faults_fired": one(2),
            "peak_rss_bytes": one(2**30), "cpu_s": one(100.0),
            "recovery": {"exception": {"p50": exception_p50, "max": exception_p50, "n": 1},
                         "sigkill": {"p50": sigkill_p50, "max": sigkill_p50, "n": 1}},
            "bit_equal_own": {"equal": 1, "compared": 1},
            "bit_equal_family": {"equal": 1, "compared": 1}}


def _doc() -> dict:
    mechanism = {"config": "c", "unavailable": None, "num_spares": 0, "family": "fsdp",
                 "bit_comparable": True}
    return {
        "size": {"name": "tiny", "state_bytes_per_rank": 742272}, "max_steps": 100,
        "quick": False, "reps": 1, "command": "cmd", "date_utc": "d", "duration_s": 1.0,
        "yardstick": {"mechanism": "torchrun", "step_s": 0.1},
        "mechanisms": {"ours": mechanism, "torchrun": mechanism},
        "references": {"ours": {"steady_step_s": 0.11, "score": {}},
                       "torchrun": {"steady_step_s": 0.1, "score": {}}},
        "calibration": {}, "intervals": {"ours": {"durable": 5, "local": 1},
                                         "torchrun": {"durable": 7, "local": 2}},
        "overhead_vs_torchrun": {"ours": 0.1, "torchrun": 0.0},
        "scenarios": {"aws": {"plan": {"faults": [{"step": 5, "rank": 1, "kind": "exception"},
                                                  {"step": 9, "rank": 1, "kind": "sigkill"}]},
                              "skipped": {}, "runs": [],
                              "summary": {"ours": _summary(0.80, 20.0, 1.0, 4.0),
                                          "torchrun": _summary(0.85, 18.0, 6.0, 7.0)}}},
    }


def test_the_prose_says_where_ours_loses_and_splits_the_time_gap() -> None:
    lines = prose.where_ours_loses(_doc(), "aws")
    assert "- training goodput: ours 80.0%, torchrun 85.0%." in lines
    assert "- time to the last step: ours 20.0 s, torchrun 18.0 s." in lines
    assert not any("recovery" in line for line in lines if line.startswith("- "))
    gap = lines[-1]
    assert "last step, torchrun, ours" in gap and "+2.0 s" in gap and "steady steps +1.0 s" in gap
    leading = copy.deepcopy(_doc())
    leading["scenarios"]["aws"]["summary"]["ours"] = _summary(0.9, 10.0, 0.5, 2.0)
    leading["scenarios"]["aws"]["summary"]["ours"]["peak_rss_bytes"]["median"] = 1
    leading["scenarios"]["aws"]["summary"]["ours"]["cpu_s"]["median"] = 1.0
    assert prose.where_ours_loses(leading, "aws") == [
        "Ours is ahead of every peer on every column of this table."]


def test_resume_points_give_the_step_reached_the_step_resumed_from_and_the_tier() -> None:
    """Per mechanism, its first run of the scenario: each restart's last step reached (the
    goodput report's: steps after the fault before the restart's first step, which may pass the
    fault's step), the step resumed from and the tier loaded, "none" where it started over;
    faults nobody resumed from are left out."""
    def run(steps, faults):
        timeline = RunTimeline()
        timeline.run_started(0.0, 2)
        for step, t in steps:
            timeline.step_completed(step, t, 2)
        for i, (at, t_fault, resumed, first, tier) in enumerate(faults):
            fid = f"f{i}"
            timeline.fault_detected(fid, t_fault=t_fault, t_detect=t_fault, step_at_fault=at,
                                    rank=1, cause="node_loss", kind="node_loss")
            if tier is not None:
                timeline.recovery_phase(fid, "checkpoint_load", first - 0.1, first - 0.05,
                                        tier=tier)
            if resumed is not None:
                timeline.recovery_done(fid, first, resumed)
        timeline.run_finished(max(t for _, t in steps), max(s for s, _ in steps))
        return timeline.to_dict()

    timelines = {
        "010-ours-node_loss-rep1": run([(9, 1.0)], [(9, 1.5, 8, 2.0, "memory")]),
        # steps 5 and 6 came after the first fault (at step 4) from the doomed attempt
        "003-ours-node_loss-rep0": run([(4, 1.0), (5, 1.4), (6, 1.5), (1, 2.0), (9, 3.0),
                                        (8, 4.0)],
                                       [(4, 1.2, 0, 2.0, None), (9, 3.5, 7, 4.0, "memory")]),
        "004-ours-spare-aws-rep0": run([(3, 1.0)], [(3, 1.5, 2, 2.0, "local")]),
        "005-torchft-node_loss-rep0": run([(3, 1.0)], [(3, 1.5, None, None, None)]),
    }
    doc = {"mechanisms": {"ours": {}, "ours-spare": {}, "torchft": {}}}
    text = recovery.resume_points(doc, timelines, "node_loss")
    assert "ours 6 → 0 (none), 9 → 7 (memory)." in text, text
    assert "ours-spare" not in text and "torchft" not in text, text
    assert "starts over from step 0" in text  # the node-loss note
    assert recovery.resume_points(doc, timelines, "hang") == ""
    assert recovery.resume_points(doc, None, "node_loss") == ""


def test_the_prose_names_runs_of_ours_that_did_not_finish() -> None:
    doc = copy.deepcopy(_doc())
    doc["scenarios"]["aws"]["summary"]["ours"] |= {
        "runs": 2, "ok": 1, "errors": ["OutOfMemoryError: node at 95%"]}
    lines = prose.where_ours_loses(doc, "aws")
    assert lines[2] == ("- ours finished 1 of 2 runs (OutOfMemoryError: node at 95%); every run "
                        "of torchrun finished.")
    assert "- training goodput: ours 80.0%, torchrun 85.0%." in lines
    doc["scenarios"]["aws"]["summary"]["ours"] |= {"runs": 1, "ok": 0}
    assert prose.where_ours_loses(doc, "aws") == [
        "Where ours loses:", "", "- ours finished 0 of 1 runs (OutOfMemoryError: node at 95%); "
        "every run of torchrun finished."]
    assert targets.rows_for(doc) == [["tiny", "every target", "no run of ours finished (of 1)",
                                      "–", "missed"]]


def test_targets_compare_ours_with_the_best_peer_of_each_column() -> None:
    rows = {r[1]: r for r in targets.rows_for(_doc())}
    assert rows["training goodput above every peer"][-1] == "missed"
    assert rows["exception recovery p50 5x faster than the fastest peer"][2:] == [
        "1.00 s", "6.00 s (torchrun)", "met"]
    assert rows["sigkill recovery p50 2x faster than the fastest peer"][-1] == "missed"


def test_a_recovery_target_below_one_fault_free_step_is_said_to_be_out_of_reach() -> None:
    doc = _doc()
    doc["references"]["torchrun"]["steady_step_s"] = 3.2  # the fastest FSDP step
    doc["references"]["ours"]["steady_step_s"] = 3.5
    doc["mechanisms"]["torchft"] = {**doc["mechanisms"]["torchrun"], "family": "replicated"}
    doc["references"]["torchft"] = {"steady_step_s": 0.5}  # replicas: not the same step
    assert targets.step_floor(doc) == ("torchrun", 3.2)
    rows = {r[1]: r for r in targets.rows_for(doc)}
    # sigkill: torchrun's 7.00 s / 2 = 3.50 s >= 3.2 s, so ours' 4.00 s simply missed it
    assert rows["sigkill recovery p50 2x faster than the fastest peer"][-1] == "missed"
    doc["scenarios"]["aws"]["summary"]["ours"]["recovery"]["exception"]["p50"] = 3.4
    rows = {r[1]: r for r in targets.rows_for(doc)}
    assert rows["exception recovery p50 5x faster than the fastest peer"][-1] == (
        "missed; out of reach: 1.20 s is below one step (3.20 s, torchrun)")
    assert "cannot be shorter than one fault-free step" in targets.section([doc])


def test_targets_leave_out_a_peer_that_met_fewer_faults_and_say_so() -> None:
    """A fault is met when the mechanism completed a step after it: one that never fired, or
    fired after the last step (a torchft replica training alone once its peer finished), cost
    the measured run nothing."""
    doc = _doc()
    doc["mechanisms"]["torchft"] = doc["mechanisms"]["torchrun"]
    faster = _summary(0.95, 9.0, 0.1, 0.2)  # would win every column...
    faster["recovery"]["sigkill"]["n"] = 0  # ...its SIGKILL fired after its last step
    doc["scenarios"]["aws"]["summary"]["torchft"] = faster
    rows = {r[1]: r for r in targets.rows_for(doc)}
    assert rows["exception recovery p50 5x faster than the fastest peer"][2:] == [
        "1.00 s", "6.00 s (torchrun)", "met"]
    assert all("torchft" not in r[3] for r in rows.values())
    text = targets.section([doc])
    assert "torchft at tiny (1 of 2 faults met over its runs)" in text, text
    assert "torchft replica restarts" in text
    assert targets.fewer_faults(_doc()) == {}
    other = copy.deepcopy(doc)  # another peer short of faults: over two runs, 3 of 4 met
    other["mechanisms"]["ray-train"] = other["mechanisms"].pop("torchft")
    other["scenarios"]["aws"]["summary"]["ray-train"] = {
        **other["scenarios"]["aws"]["summary"].pop("torchft"), "ok": 2, "runs": 2,
        "recovery": {"exception": {"p50": 0.1, "max": 0.1, "n": 2},
                     "sigkill": {"p50": 0.2, "max": 0.2, "n": 1}}}
    text = targets.section([other])
    assert "ray-train at tiny (3 of 4 faults met over its runs)" in text, text
    assert "torchft replica" not in text


def test_a_recovery_cell_says_when_it_pools_fewer_faults_than_the_runs_planned() -> None:
    s = _summary(0.9, 10.0, 1.0, 2.0) | {"ok": 3}
    s["recovery"]["sigkill"] |= {"n": 2, "max": 2.5}
    assert recovery._recovery(s, "exception", 1) == "1.00 s (max 1.00 s; 1 of 3 faults)"
    assert recovery._recovery(s, "sigkill", 1) == "2.00 s (max 2.50 s; 2 of 3 faults)"
    s["recovery"]["exception"]["n"] = 3
    assert recovery._recovery(s, "exception", 1) == "1.00 s (max 1.00 s)"
    assert recovery._recovery(s, "hang", 1) == "–"


def test_the_checkpoint_section_pairs_like_with_like() -> None:
    def row(method: str, throughput: float, persisted: float) -> dict:
        one = {"median": throughput, "min": throughput, "max": throughput, "n": 1}
        return {"size": "tiny", "interval": 1, "method": method, "steps": 10, "durable": True,
                "state_mb": 0.74, "blocking_median_s": 0.001, "blocking_p99_s": 0.002,
                "aws_efficiency": one, "throughput_efficiency": one,
                "persisted_fraction": {**one, "median": persisted},
                "staleness": {"steps_median": 1, "steps_p99": 2, "steps_max": 2,
                              "seconds_median": 0.1, "seconds_p99": 0.2},
                "held_mb": {**one, "median": 3.0}}
    ours = {**row("ours_block", 0.7, 1.0),
            "cpu_per_save_s": {"median": 0.42, "min": 0.4, "max": 0.5, "n": 3},
            "intake": {"adopted": 12, "pulled": 0, "filled": 0, "copied": 0, "unmapped": 0}}
    doc = {"quick": True, "command": "c", "date_utc": "d", "duration_s": 1.0, "reps": 1,
           "rows": [ours, row("dcp_async", 0.9, 1.0)]}
    text = checkpoint.section(doc)
    assert "- ours_block vs dcp_async (both persist every save): throughput efficiency 70.0% " \
           "vs 90.0% (ours behind)" in text
    # the machine's extra CPU per save, where measured; how ours' writers took the snapshots
    assert "CPU per save 0.42 s (0.40 s–0.50 s) vs –; ours' writers took the snapshots " \
           "adopted 12 (adopted: no copy)." in text
    assert "**Quick run**" in text


def test_a_checkpoint_rerun_of_one_size_replaces_only_its_rows_and_sitting(tmp_path) -> None:
    from ckpt import sittings  # noqa: PLC0415
    from sweep.results import write_json  # noqa: PLC0415

    def doc(command: str, sizes: tuple[str, ...], *, quick: bool = False) -> dict:
        return {"benchmark": "checkpoint", "command": command, "date_utc": command,
                "duration_s": 1.0, "reps": 1 if quick else 3, "quick": quick,
                "rows": [{"size": s, "method": "ours_block", "by": command} for s in sizes]}
    path = str(tmp_path / "checkpoint.json")
    write_json(path, doc("old", ("tiny", "200mb"), quick=True))  # no "sittings": older format
    new = doc("new", ("200mb", "1gb"))
    new["sittings"] = dict.fromkeys(("200mb", "1gb"), sittings.sitting(new))
    got = sittings.merged(path, new)
    assert [(r["size"], r["by"]) for r in got["rows"]] == [
        ("tiny", "old"), ("200mb", "new"), ("1gb", "new")]
    assert got["sittings"]["tiny"]["command"] == "old" and got["sittings"]["tiny"]["quick"]
    assert got["sittings"]["200mb"]["command"] == got["sittings"]["1gb"]["command"] == "new"
    assert got["command"] == "new"
    assert sittings.merged(str(tmp_path / "none.json"), new) is new
    # A size's failed configurations go with its rows: the rerun's replace the old ones.
    old = {**doc("old", ("tiny", "200mb")), "failures": [
        {"size": "tiny", "rep": 0}, {"size": "200mb", "rep": 1}]}
    write_json(path, old)
    new["failures"] = [{"size": "1gb", "rep": 2}]
    got = sittings.merged(path, new)
    assert [(f["size"], f["rep"]) for f in got["failures"]] == [("tiny", 0), ("1gb", 2)]


def test_the_checkpoint_section_names_the_sitting_of_each_size() -> None:
    base = {"command": "c1", "date_utc": "d1", "duration_s": 1.0, "reps": 1, "quick": True}
    # A rerun of tiny alone appended its rows after 1gb's: the page still goes by state size.
    doc = {**base, "rows": [{"size": "1gb", "state_mb": 2004.0, "interval": 5},
                            {"size": "tiny", "state_mb": 1.48, "interval": 10},
                            {"size": "tiny", "state_mb": 1.48, "interval": 1}], "sittings": {
        "tiny": base, "1gb": {**base, "command": "c2", "reps": 3, "quick": False}}}
    failures = [{"size": "1gb", "method": "nvrx_local", "interval": 5, "rep": 1,
                 "error": "OutOfMemoryError: killed"}]
    produced = [checkpoint._produced(size, s, failures)
                for size, s in checkpoint._sittings(doc).items()]
    assert produced[0].startswith("- tiny: `c1` on d1 (1 s, 1 repetition(s)). **Quick run**")
    assert "Failed" not in produced[0]
    assert produced[1] == ("- 1gb: `c2` on d1 (1 s, 3 repetition(s)). Failed, left out of its "
                           "row: nvrx_local every 5 in repetition 1 (OutOfMemoryError: killed).")
    assert [(r["size"], r["interval"]) for r in checkpoint._rows(doc)] == [
        ("tiny", 1), ("tiny", 10), ("1gb", 5)]


def test_the_overhead_section_judges_the_paired_mean_step_against_each_budget() -> None:
    def stat(x: float) -> dict:
        return {"median": x, "min": x, "max": x, "n": 3}

    def arm() -> dict:
        return {"ok": 3, "runs": 3, "wall_median_s": stat(0.1), "wall_mean_s": stat(0.1),
                "startup": {"total": stat(10.0)}}

    def paired(x: float) -> dict:
        return {"wall_mean_s": stat(x)}

    # Peak memory is the run's own measure (shared pages once), not the RSS sum (2000 MB).
    run = {"arm": "ours", "status": "ok", "local_interval_steps": 7,
           "usage": {"peak_memory_bytes": 1_500_000_000}, "accounting": {
        "processes": {"ray::RankActor": {"count": 2, "cpu_s": 4.0, "cpu_per_step_s": 0.2,
                                         "core_share": 0.9, "rss_bytes": 2_000_000_000}},
        "rank_threads": {"MainThread": {"count": 2, "cpu_per_step_s": 0.15,
                                        "switches_per_step": 3.0, "nice": [0]}}}}
    entry = {"size": "200mb", "durable_every": 10, "runs": [run],
             "arms": {"torchrun": arm(), "ours-disabled": arm(), "ours": arm()},
             "paired": {"ours vs torchrun": paired(0.035), "ours vs ours-disabled": paired(0.004)}}
    doc = {"date_utc": "d", "reps": 3, "arms": ["torchrun", "ours-disabled", "ours"],
           "sizes": {"200mb": entry}}
    assert overhead.verdicts(doc) == [
        "200mb: vs no resilience 0.4% (target <= 1%: met); vs torchrun 3.5% (target <= 2%: missed)"]
    text = overhead.section(doc)
    ours = next(line for line in text.splitlines() if line.startswith("| 200mb | ours |"))
    assert "| 3.5% | 0.4% | – | – | 7 |" in ours and "| 1500 MB |" in ours
    assert "2000 MB" not in ours
    assert "| 200mb | ray::RankActor | 2 | 200.0 ms | 90.0% | 2000 MB |" in text


def test_check_also_fails_when_docs_scale_md_is_stale(tmp_path, monkeypatch) -> None:
    """scale.md derives from the committed tiny recovery results too: `render.py --check` with
    the default results checks it, so a rerun that forgot it fails before CI does."""
    from controlplane import scale  # noqa: PLC0415 - imports the library (ray)

    calls: list[list[str]] = []
    monkeypatch.setattr(scale, "main", lambda argv: calls.append(argv) or 1)
    assert render.main(["--check"]) == 1
    assert calls == [["--check"]]
    monkeypatch.setattr(scale, "main", lambda argv: calls.append(argv) or 0)
    assert render.main(["--check"]) == 0


@pytest.mark.parametrize("check", ["writer-import-deferred", "writer-import-at-rank-priority"])
def test_the_recovery_before_after_summary_reads_the_committed_check(check: str) -> None:
    import recovery_ab  # noqa: PLC0415 - a script beside render.py

    folder = os.path.join(RESULTS, "recovery-checks", check)
    found = {key: recovery_ab.summary(runs)
             for key, runs in recovery_ab.runs_by_label(folder, "ours").items()}
    assert sorted(found) == [("200mb", "after"), ("200mb", "before"), ("tiny", "after"),
                             ("tiny", "before")]
    assert [found[("tiny", label)]["runs"] for label in ("before", "after")] == [6, 6]
    assert all(s["bit_equal"] for s in found.values())
    assert all(s["startup_s"] + s["after_startup_s"] > 0 for s in found.values())


def test_the_recovery_before_after_summary_reads_a_scenario_and_its_phases(tmp_path) -> None:
    import gzip  # noqa: PLC0415

    import recovery_ab  # noqa: PLC0415 - a script beside render.py

    def sitting(label: str, rendezvous: list[float]) -> None:
        runs, timelines = [], {}
        for rep, seconds in enumerate(rendezvous):
            runs.append({"mechanism": "ours", "status": "ok", "rep": rep,
                         "params_equal_own": True,
                         "score": {"wall_s": 90.0, "startup_s": 20.0,
                                   "recovery_s": {"node_loss": [10.0 + seconds]}}})
            timelines[f"00{rep + 4}-ours-node_loss-rep{rep}"] = {"faults": [{"phases": [
                {"phase": "teardown", "t_start": 0.0, "t_end": 0.5},
                {"phase": "rendezvous", "t_start": 0.5, "t_end": 0.5 + seconds}]}]}
        base = tmp_path / f"200mb-{label}-0"
        (tmp_path / f"{base.name}.json").write_text(json.dumps(
            {"scenarios": {"node_loss": {"runs": runs}}}))
        with gzip.open(f"{base}.timelines.json.gz", "wt") as f:
            json.dump(timelines, f)
        if label == "after":  # the runs' own phases: the respawned rank ready 0.25 s before
            (tmp_path / f"{base.name}.phases").mkdir()  # the new attempt's launch
            for name in timelines:
                (tmp_path / f"{base.name}.phases" / f"{name}.json").write_text(json.dumps(
                    {"phases": [{"phase": "prewarm", "attempt": 1, "t_end": 10.0},
                                {"phase": "release_groups", "attempt": 1, "t_start": 10.25},
                                {"phase": "prewarm", "attempt": 0, "t_end": 1.0},
                                {"phase": "release_groups", "attempt": 0, "t_start": 9.0}]}))

    sitting("before", [9.0, 8.0, 10.0])
    sitting("after", [7.0, 6.0])
    assert recovery_ab.runs_by_label(str(tmp_path), "ours") == {}  # no AWS runs in them
    found = {key: recovery_ab.summary(runs) for key, runs
             in recovery_ab.runs_by_label(str(tmp_path), "ours", "node_loss").items()}
    assert found[("200mb", "before")]["rendezvous_p50_s"] == 9.0
    assert found[("200mb", "after")]["rendezvous_p50_s"] == 6.5
    assert found[("200mb", "after")]["node_loss_p50_s"] == 16.5
    assert found[("200mb", "after")]["teardown_p50_s"] == 0.5
    assert found[("200mb", "after")]["launch_wait_p50_s"] == 0.25  # the first start is no wait
    assert "launch_wait_p50_s" not in found[("200mb", "before")]  # no phases files there
    assert all(s["bit_equal"] and s["runs"] in (2, 3) for s in found.values())


def test_the_recovery_before_after_summary_splits_phases_by_fault_kind(tmp_path) -> None:
    import gzip  # noqa: PLC0415

    import recovery_ab  # noqa: PLC0415 - a script beside render.py

    def fault(kind: str, rendezvous: float, first_step: float) -> dict:
        return {"kind": kind, "t_first_step": 1.0 + rendezvous + first_step, "phases": [
            {"phase": "rendezvous", "t_start": 1.0, "t_end": 1.0 + rendezvous}]}

    runs = [{"mechanism": "ours", "status": "ok", "rep": 0, "params_equal_own": True,
             "score": {"wall_s": 50.0, "startup_s": 10.0,
                       "recovery_s": {"exception": [1.0], "sigkill": [3.0]}}}]
    (tmp_path / "tiny-after-0.json").write_text(json.dumps({"scenarios": {"aws": {"runs": runs}}}))
    with gzip.open(tmp_path / "tiny-after-0.timelines.json.gz", "wt") as f:
        json.dump({"004-ours-aws-rep0": {"faults": [
            fault("exception", 0.1, 0.5), fault("sigkill", 1.0, 1.25),
            fault("sigkill", 2.0, 0.75)]}}, f)
    (found,) = [recovery_ab.summary(r) for r in recovery_ab.runs_by_label(str(tmp_path),
                                                                           "ours").values()]
    assert found["rendezvous_p50_s"] == 1.0 and found["first_step_p50_s"] == 0.75
    assert found["exception_rendezvous_p50_s"] == 0.1
    assert found["sigkill_rendezvous_p50_s"] == 1.5
    assert found["exception_first_step_p50_s"] == 0.5 and found["sigkill_first_step_p50_s"] == 1.0


def _probe_run(variant: str, steady: float, first: float, env: dict | None = None) -> dict:
    return {"variant": variant, "env": env or {}, "summary": {
        "steady_step_s": steady, "after_rebuild_first_step_s": first,
        "after_rebuild_later_step_s": steady, "steady_step_faults": 10.0,
        "after_rebuild_first_step_faults": 9000.0}}


def test_the_rebuild_section_gives_each_allocator_variant_its_medians() -> None:
    doc = {"size": "200mb", "command": "python probe", "started": "2026-12-06 18:14 UTC",
           "runs": [_probe_run("trim", 0.6, 0.8), _probe_run("keep", 0.5, 0.52,
                                                              {"MALLOC_ARENA_MAX": "1"}),
                    _probe_run("trim", 0.62, 0.76), _probe_run("keep", 0.54, 0.56,
                                                               {"MALLOC_ARENA_MAX": "1"})]}
    text = rebuild.section([doc])
    rows = {line.split(" | ")[1]: line for line in text.splitlines()
            if line.startswith("| 200mb")}
    assert list(rows) == ["trim", "keep"]  # in the order the sitting ran them
    assert "| 610.0 ms | 780.0 ms |" in rows["trim"] and "| 170.0 ms |" in rows["trim"]
    assert "| 520.0 ms | 540.0 ms |" in rows["keep"] and "MALLOC_ARENA_MAX=1" in rows["keep"]
    assert "`python probe` on 2026-12-06 18:14 UTC" in text
    assert rebuild.section([]) == ""


def test_a_sitting_run_with_glibc_keeping_freed_memory_says_so() -> None:
    docs, _ = render.load(RESULTS)
    doc = copy.deepcopy(docs[0])
    assert "glibc told to keep" not in recovery.section(doc, None)  # committed: glibc as it comes
    doc["allocator_env"] = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0"}
    text = recovery.section(doc, None)
    assert ("Every mechanism's processes ran with glibc told to keep freed memory "
            "(`MALLOC_ARENA_MAX=1` `MALLOC_MMAP_MAX_=0`") in text


def test_a_kept_memory_sitting_renders_after_the_main_ones_outside_the_targets(tmp_path) -> None:
    shutil.copy(os.path.join(RESULTS, "recovery-tiny.json"), tmp_path)
    main_page = render.render(str(tmp_path))
    docs, _ = render.load(RESULTS)
    kept = copy.deepcopy(next(d for d in docs if d["size"]["name"] == "200mb"))
    kept["allocator_env"] = {"MALLOC_ARENA_MAX": "1"}
    os.makedirs(tmp_path / render.KEPT_DIR)
    with open(tmp_path / render.KEPT_DIR / "recovery-200mb.json", "w", encoding="utf-8") as f:
        json.dump(kept, f)
    page = render.render(str(tmp_path))
    assert "## Recovery: 200mb, glibc keeping freed memory (" in page
    assert page.index("## Recovery: tiny") < page.index("## Recovery: 200mb, glibc")
    targets_of = lambda text: text.split("## Targets", 1)[1].split("\n## ", 1)[0]  # noqa: E731
    assert targets_of(page) == targets_of(main_page)  # judged on glibc as it comes only


def test_a_side_scenarios_sitting_renders_after_its_sizes_main_section(tmp_path) -> None:
    for name in ("recovery-tiny.json", "recovery-200mb.json"):
        shutil.copy(os.path.join(RESULTS, name), tmp_path)
    main_page = render.render(str(tmp_path))
    docs, _ = render.load(RESULTS)
    side = copy.deepcopy(next(d for d in docs if d["size"]["name"] == "tiny"))
    side["scenarios"] = {k: v for k, v in side["scenarios"].items() if k != "aws"}
    assert set(side["scenarios"]) == {"hang", "node_loss"}
    os.makedirs(tmp_path / render.SIDE_DIR)
    with open(tmp_path / render.SIDE_DIR / "recovery-tiny.json", "w", encoding="utf-8") as f:
        json.dump(side, f)
    page = render.render(str(tmp_path))
    heading = "## Recovery: tiny, hangs and node loss in a sitting of their own ("
    assert heading in page
    assert (page.index("## Recovery: tiny (") < page.index(heading)
            < page.index("## Recovery: 200mb ("))
    side_section = page.split(heading, 1)[1].split("\n## ", 1)[0]
    assert "### Hangs" in side_section and "### AWS" not in side_section
    assert "AWS schedule" not in side_section.split("\n\n", 2)[1]  # the sitting ran none
    assert "AWS schedule 3 repetition(s)" in page.split(heading, 1)[0]  # the main one did
    targets_of = lambda text: text.split("## Targets", 1)[1].split("\n## ", 1)[0]  # noqa: E731
    assert targets_of(page) == targets_of(main_page)  # judged on the main sittings only


def test_a_replica_sitting_renders_after_its_sizes_side_sitting_and_names_the_variant(
        tmp_path) -> None:
    shutil.copy(os.path.join(RESULTS, "recovery-tiny.json"), tmp_path)
    with open(os.path.join(RESULTS, "recovery-200mb.json"), encoding="utf-8") as f:
        older = json.load(f)  # as sittings before 2026-12-07 were: no cluster recorded
    for scenario in older["scenarios"].values():
        scenario.pop("cluster", None)
    with open(tmp_path / "recovery-200mb.json", "w", encoding="utf-8") as f:
        json.dump(older, f)
    main_page = render.render(str(tmp_path))
    docs, _ = render.load(RESULTS)
    tiny = next(d for d in docs if d["size"]["name"] == "tiny")
    side = copy.deepcopy(tiny)
    side["scenarios"] = {k: v for k, v in side["scenarios"].items() if k != "aws"}
    replica = copy.deepcopy(tiny)
    replica["scenarios"] = {"node_loss": copy.deepcopy(tiny["scenarios"]["node_loss"])}
    replica["mechanisms"]["ours-replica"] = replica["mechanisms"]["ours"]
    replica["scenarios"]["node_loss"]["cluster"] = {"description": "head + 2 raylets",
                                                    "node_object_store_bytes": 3 * 2**30}
    for folder, doc in ((render.SIDE_DIR, side), (render.REPLICA_DIR, replica)):
        os.makedirs(tmp_path / folder)
        with open(tmp_path / folder / "recovery-tiny.json", "w", encoding="utf-8") as f:
            json.dump(doc, f)
    page = render.render(str(tmp_path))
    heading = "## Recovery: tiny, node loss in a sitting of its own, with ours-replica ("
    assert heading in page
    assert (page.index("## Recovery: tiny (")
            < page.index("## Recovery: tiny, hangs and node loss in a sitting of their own (")
            < page.index(heading) < page.index("## Recovery: 200mb ("))
    section = page.split(heading, 1)[1].split("\n## ", 1)[0]
    assert "### Node loss" in section and "### Hangs" not in section
    assert "Cluster: head + 2 raylets (3.00 GiB per worker node;" in section
    assert "Cluster:" not in page.replace(section, "")  # older sittings recorded none
    # that ~200 MB sitting ran on nodes with 150 MiB object stores: said so, once (its
    # node-loss scenario); tiny's state fits them
    assert page.count("had `ray.cluster_utils`' 150 MiB object store") == 1
    assert "150 MiB object store" in page.split("## Recovery: 200mb (", 1)[1]
    targets_of = lambda text: text.split("## Targets", 1)[1].split("\n## ", 1)[0]  # noqa: E731
    assert targets_of(page) == targets_of(main_page)  # judged on the main sittings only

