"""The overhead benchmark's arithmetic on synthetic step logs: per-step wall and CPU time from
consecutive step events, warm-up left out, re-run steps counted once, arms parsed with their
checkouts, per-repetition ratios."""

from __future__ import annotations

import json
import os
import sys
import threading

import pytest

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                     "jobs", "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

from harness.events import write_events  # noqa: E402
from harness.spec import PHASES_FILE  # noqa: E402
from harness.threads import snapshot  # noqa: E402
from overhead.ab import _paired  # noqa: E402
from overhead.accounting import account  # noqa: E402
from overhead.arms import parse_arms  # noqa: E402
from overhead.map_cost import map_cost  # noqa: E402
from overhead.startup import split  # noqa: E402
from overhead.steps import run_costs  # noqa: E402
from sweep.runner import PROCESSES_FILE  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def _steps(rank: int, n: int, *, wall: float, thread: float, process: float) -> list[dict]:
    return [{"ev": "step", "rank": rank, "step": s, "t": 100.0 + s * wall,
             "thread_cpu_s": s * thread, "cpu_s": s * process, "loss": 1.0}
            for s in range(1, n + 1)]


def test_costs_are_per_step_differences_after_the_warmup(tmp_path) -> None:
    run = str(tmp_path)
    slow_start = _steps(0, 20, wall=0.1, thread=0.05, process=0.06)
    slow_start[0]["t"] -= 5.0  # step 1 took long: inside the warm-up, not counted
    write_events(run, "rank0", slow_start)
    write_events(run, "rank1", _steps(1, 20, wall=0.1, thread=0.03, process=0.05))
    costs = run_costs(run, warmup=2)
    assert costs["wall_median_s"] == pytest.approx(0.1)
    assert costs["wall_mean_s"] == pytest.approx(0.1)
    assert costs["thread_cpu_median_s"] == pytest.approx(0.04)  # the mean of the ranks'
    assert costs["process_cpu_median_s"] == pytest.approx(0.055)
    assert costs["per_rank"]["0"]["steps"] == 17  # steps 3..20: 17 intervals


def test_a_step_logged_twice_counts_once_and_gaps_are_skipped(tmp_path) -> None:
    run = str(tmp_path)
    events = _steps(0, 10, wall=0.1, thread=0.05, process=0.05)
    events = [e for e in events if e["step"] != 6]  # a gap: 5 -> 7 is no step interval
    events.append({**events[-1], "t": events[-1]["t"] + 0.1})  # step 10 again, later
    write_events(run, "rank0", events)
    costs = run_costs(run, warmup=0)
    assert costs["per_rank"]["0"]["steps"] == 7
    assert costs["wall_mean_s"] == pytest.approx((0.1 * 6 + 0.2) / 7)


def test_the_late_mean_leaves_a_first_half_one_time_cost_out(tmp_path) -> None:
    run = str(tmp_path)
    events = _steps(0, 21, wall=0.1, thread=0.05, process=0.05)
    for e in events[5:]:
        e["t"] += 1.0  # step 6 paid a one-time second (a first save's allocation)
    write_events(run, "rank0", events)
    costs = run_costs(run, warmup=0)  # 20 intervals: the late mean is over the last 10
    assert costs["wall_mean_s"] == pytest.approx(0.1 + 1.0 / 20)
    assert costs["wall_late_mean_s"] == pytest.approx(0.1)


def test_no_steps_means_no_costs(tmp_path) -> None:
    assert run_costs(str(tmp_path), warmup=0) is None


def test_arms_name_their_checkout() -> None:
    arms = parse_arms(["torchrun", "ours@before"], {"before": "/tmp/x"})
    assert [a.mechanism for a in arms] == ["torchrun", "ours"]
    assert arms[0].checkout is None and arms[1].paths == ["/tmp/x/jobs/bench", "/tmp/x"]
    with pytest.raises(ValueError, match="--checkout after=PATH"):
        parse_arms(["ours@after"], {})


def test_paired_ratios_are_taken_within_each_repetition() -> None:
    arms = parse_arms(["a", "b"], {})
    kinds = {"wall_median_s": 1.0, "wall_mean_s": 1.0, "thread_cpu_median_s": 1.0,
             "thread_cpu_mean_s": 1.0, "process_cpu_median_s": 1.0, "process_cpu_mean_s": 1.0}
    runs = [{"arm": "a", "rep": 0, "costs": {**kinds, "wall_median_s": 1.1}},
            {"arm": "b", "rep": 0, "costs": kinds},
            {"arm": "a", "rep": 1, "costs": {**kinds, "wall_median_s": 2.2}},
            {"arm": "b", "rep": 1, "costs": {**kinds, "wall_median_s": 2.0}},
            {"arm": "a", "rep": 2, "costs": None}]
    wall = _paired(arms, runs)["a vs b"]["wall_median_s"]
    assert wall["median"] == pytest.approx(0.1) and wall["n"] == 2


def test_accounting_charges_the_window_between_two_thread_snapshots(tmp_path) -> None:
    run = str(tmp_path)

    def threads(step: int, t: float, train_cpu: float, progress_cpu: float) -> dict:
        return {"ev": "threads", "rank": 0, "step": step, "t": t, "threads": [
            {"tid": 1, "name": "rr-train-r0-a0", "python": True, "cpu_s": train_cpu, "nice": 0,
             "voluntary": 10 * step, "involuntary": step},
            {"tid": 2, "name": "rr-progress-r0-a0", "python": True, "cpu_s": progress_cpu,
             "nice": 0, "voluntary": step, "involuntary": 0},
            {"tid": 3, "name": "gloo_tcp_loop", "python": False, "cpu_s": 0.5, "nice": 0,
             "voluntary": 0, "involuntary": 0}]}

    write_events(run, "rank0", [threads(10, 100.0, 1.0, 0.1), threads(30, 102.0, 2.0, 0.14)])
    samples = {"7": {"role": "raylet", "samples": [[99.0, 5.0, 100], [101.0, 5.2, 300],
                                                   [102.0, 5.4, 200], [103.0, 9.0, 900]]},
               "8": {"role": "ray::WorkerActor", "samples": [[101.5, 0.3, 50]]},
               "9": {"role": "gone", "samples": [[50.0, 1.0, 10]]}}
    with open(tmp_path / PROCESSES_FILE, "w") as f:
        json.dump(samples, f)
    found = account(run)
    assert found["steps"] == 20 and found["window_s"] == pytest.approx(2.0)
    raylet = found["processes"]["raylet"]
    assert raylet["cpu_s"] == pytest.approx(0.4) and raylet["rss_bytes"] == 300
    assert raylet["cpu_per_step_s"] == pytest.approx(0.02)
    assert raylet["core_share"] == pytest.approx(0.2)
    assert found["processes"]["ray::WorkerActor"]["cpu_s"] == pytest.approx(0.3)  # born inside
    assert "gone" not in found["processes"]
    train = found["rank_threads"]["rr-train"]
    assert train["cpu_per_step_s"] == pytest.approx(0.05)
    assert train["switches_per_step"] == pytest.approx(11.0) and train["nice"] == [0]
    assert list(found["rank_threads"]) == ["rr-train", "rr-progress", "gloo_tcp_loop"]


def test_thread_snapshot_names_python_threads_and_counts_cpu() -> None:
    done = threading.Event()
    worker = threading.Thread(target=done.wait, name="bench-test-thread")
    worker.start()
    try:
        rows = {t["name"]: t for t in snapshot()}
    finally:
        done.set()
        worker.join()
    assert rows["bench-test-thread"]["python"] and rows["MainThread"]["cpu_s"] > 0


def test_startup_split_follows_the_last_rank_through_ours_phases(tmp_path) -> None:
    run = str(tmp_path)
    phases = [{"phase": "placement", "t_start": 13.0, "t_end": 14.0, "attempt": 0, "rank": None}]
    for rank, (boot, imported, warm) in enumerate([(15.0, 17.0, 18.0), (15.5, 17.5, 18.5)]):
        phases += [{"phase": "process_start", "t_start": 14.2, "t_end": boot, "rank": rank},
                   {"phase": "imports", "t_start": boot, "t_end": imported, "rank": rank},
                   {"phase": "prewarm", "t_start": imported, "t_end": warm, "rank": rank}]
    phases = [{**p, "attempt": 0} for p in phases]
    phases.append({"phase": "prewarm", "t_start": 40.0, "t_end": 41.0, "attempt": 1, "rank": 1})
    with open(tmp_path / PHASES_FILE, "w") as f:
        json.dump({"t_launch": 10.0, "t_fit": 12.0, "phases": phases}, f)
    write_events(run, "rank0", [{"ev": "pg_ready", "rank": 0, "t": 19.0},
                                {"ev": "step", "rank": 0, "step": 1, "t": 20.0},
                                {"ev": "step", "rank": 0, "step": 2, "t": 20.1}])
    write_events(run, "rank1", [{"ev": "pg_ready", "rank": 1, "t": 19.2}])
    got = split(run, 10.0)
    assert got == pytest.approx({
        "runtime": 2.0, "launcher": 2.0, "boot": 1.5, "imports": 2.0, "prewarm": 1.0,
        "rendezvous + build": 0.7, "load": 0.0, "first step": 0.8, "total": 10.0})


def test_startup_split_of_a_launcher_run_has_no_runtime_boot_or_prewarm(tmp_path) -> None:
    run = str(tmp_path)
    for rank in (0, 1):
        write_events(run, f"rank{rank}", [
            {"ev": "start", "rank": rank, "pid": 100 + rank, "t": 11.0 + rank},
            {"ev": "imported", "rank": rank, "t": 14.0},
            {"ev": "pg_ready", "rank": rank, "t": 15.0},
            {"ev": "load", "rank": rank, "t": 15.5, "t_start": 15.0, "from_step": 0},
            {"ev": "step", "rank": rank, "step": 1, "t": 16.0}])
    got = split(run, 10.0)
    assert got == pytest.approx({
        "runtime": 0.0, "launcher": 2.0, "boot": 0.0, "imports": 2.0, "prewarm": 0.0,
        "rendezvous + build": 1.0, "load": 0.5, "first step": 0.5, "total": 6.0})


def test_ours_load_segment_ends_with_the_fresh_init_of_the_first_attempt(tmp_path) -> None:
    """Ours logs a "load" event after `load_checkpoint` and, on a fresh start, the seed's weights
    (as the launcher peers do): the segment ends there, not at the end of our load phase, and a
    later attempt's load does not move it."""
    run = str(tmp_path)
    phases = [{"phase": "placement", "t_start": 13.0, "t_end": 14.0, "attempt": 0, "rank": None},
              {"phase": "checkpoint_load", "t_start": 19.0, "t_end": 19.1, "attempt": 0,
               "rank": 0}]
    with open(tmp_path / PHASES_FILE, "w") as f:
        json.dump({"t_launch": 10.0, "t_fit": 12.0, "phases": phases}, f)
    write_events(run, "rank0", [{"ev": "pg_ready", "rank": 0, "t": 19.0},
                                {"ev": "load", "rank": 0, "t": 19.6, "t_start": 19.0,
                                 "from_step": 0},
                                {"ev": "step", "rank": 0, "step": 1, "t": 20.0},
                                {"ev": "load", "rank": 0, "t": 30.0, "t_start": 29.0,
                                 "from_step": 1},
                                {"ev": "step", "rank": 0, "step": 2, "t": 31.0}])
    got = split(run, 10.0)
    assert got["load"] == pytest.approx(0.6) and got["first step"] == pytest.approx(0.4)


def test_a_rerun_of_one_size_replaces_only_that_size_and_keeps_each_sittings_date(tmp_path):
    import bench_overhead  # noqa: PLC0415
    from report.overhead import _sittings  # noqa: PLC0415
    from sweep.results import write_json  # noqa: PLC0415

    def doc(date, reps, arms, sizes):
        return {"benchmark": "overhead", "date_utc": date, "command": f"run {date}", "reps": reps,
                "arms": arms, "sizes": {name: {"size": name, "arms": {a: {} for a in arms},
                                               "marker": date} for name in sizes}}

    path = str(tmp_path / "overhead.json")
    write_json(path, doc("day 1", 3, ["torchrun", "ours-disabled", "ours"], ["tiny", "1gb"]))
    new = doc("day 2", 2, ["ours-disabled", "ours-nockpt", "ours"], ["1gb"])
    new["sizes"]["1gb"]["sitting"] = bench_overhead.sitting(new)
    got = bench_overhead.merged(path, new)
    assert got["sizes"]["tiny"]["marker"] == "day 1" and got["sizes"]["1gb"]["marker"] == "day 2"
    assert got["sizes"]["tiny"]["sitting"]["reps"] == 3 and "ours" in got["sizes"]["1gb"]["arms"]
    assert isinstance(got["sizes"]["1gb"]["arms"], dict)  # the per-arm results, untouched
    assert got["arms"] == ["torchrun", "ours-disabled", "ours-nockpt", "ours"]
    assert _sittings(got, [got["sizes"]["tiny"], got["sizes"]["1gb"]]) == \
        "tiny: day 1, 3 repetitions; 1gb: day 2, 2 repetitions"
    assert bench_overhead.merged(str(tmp_path / "none.json"), new) is new


def test_the_split_charges_each_part_to_the_arm_without_it_and_skips_unmeasured_parts():
    from report.overhead import split_rows  # noqa: PLC0415

    def pair(median):
        return {"wall_mean_s": {"median": median, "min": median, "max": median, "n": 3}}

    entry = {"size": "1gb", "paired": {"ours-nockpt vs ours-disabled": pair(0.07),  # no 2nd half
                                        "ours-nolocal vs ours-nockpt": pair(0.1),
                                        "torchrun-dcp vs torchrun": pair(0.08),
                                        "ours vs ours-nolocal": pair(0.05)}}
    rows = split_rows(entry)
    assert [r[2] for r in rows] == ["ours-nockpt vs ours-disabled", "ours-nolocal vs ours-nockpt",
                                    "torchrun-dcp vs torchrun", "ours vs ours-nolocal"]
    # no ours-disabled vs torchrun pair: that part skipped
    assert [r[3] for r in rows] == ["7.0%", "10.0%", "8.0%", "5.0%"]
    assert [r[4] for r in rows] == ["–"] * 4  # a sitting from before the second-half figure
    assert split_rows({"size": "tiny", "paired": {}}) == []


def test_the_nolocal_arm_saves_like_ours_with_the_local_tier_off():
    from harness.spec import Workload  # noqa: PLC0415
    from overhead.arms import SETTINGS  # noqa: PLC0415

    ours, nolocal, nockpt, dcp, torchrun = parse_arms(
        ["ours", "ours-nolocal", "ours-nockpt", "torchrun-dcp", "torchrun"], {})
    base = Workload(data_dir="/data", run_dir="/run")
    setting = SETTINGS["1gb"]
    assert nolocal.workload(base, setting).checkpoint_interval == setting.durable_every
    assert nolocal.workload(base, setting).local_interval == 0
    assert ours.workload(base, setting).local_interval == setting.local_every
    assert nockpt.workload(base, setting).checkpoint_interval == 0
    # torchrun-dcp saves the steps ours-nolocal saves, with DCP async only; torchrun saves none
    assert dcp.workload(base, setting) == nolocal.workload(base, setting)
    assert torchrun.workload(base, setting).checkpoint_interval == 0


def test_the_dcp_arm_is_torchrun_under_its_own_name_and_not_in_the_recovery_sweep():
    from peers import MECHANISMS, SWEPT, family, make_peer  # noqa: PLC0415

    assert MECHANISMS["torchrun-dcp"] == ("torchrun_peer", "TorchrunPeer",
                                          {"name": "torchrun-dcp"})
    # where the peers' software is installed (the bench extra) it is torchrun under its own
    # name; elsewhere it is listed as missing, under its own name too
    peer = make_peer("torchrun-dcp", timeout_s=5.0)
    assert peer.name == "torchrun-dcp" and type(peer).__name__ in ("TorchrunPeer", "Missing")
    assert "torchrun-dcp" in MECHANISMS and "torchrun-dcp" not in SWEPT
    assert family("torchrun-dcp") == "fsdp"


def test_the_write_probe_reports_cpu_and_wall_per_gb_and_leaves_nothing(tmp_path):
    from sweep.machine import touch_cost, write_cost  # noqa: PLC0415

    got = write_cost(str(tmp_path), nbytes=2**20)
    assert got["folder"] == str(tmp_path) and got["bytes"] == 2**20
    assert got["cpu_s_per_gb"] >= 0 and got["wall_s_per_gb"] > 0
    assert list(tmp_path.iterdir()) == []
    direct = write_cost(str(tmp_path), nbytes=2**20 + 5, direct=True)
    assert direct["cpu_s_per_gb"] >= 0 and isinstance(direct["direct"], bool)
    assert list(tmp_path.iterdir()) == []
    touched = touch_cost(nbytes=2**20)
    assert touched["bytes"] == 2**20 and touched["first_cpu_s_per_gb"] >= 0
    assert touched["again_cpu_s_per_gb"] >= 0
    with pytest.raises(FileNotFoundError):
        write_cost(str(tmp_path / "missing"), nbytes=4096)


def test_the_page_names_the_write_cost_of_each_sitting_that_measured_it():
    from report.overhead import write_costs  # noqa: PLC0415

    def probe(disk, shm):
        return {"storage": {"cpu_s_per_gb": disk}, "tmpfs": {"cpu_s_per_gb": shm}}

    sizes = [{"size": "tiny"},
             {"size": "1gb", "write_cost": {"before": probe(7.5, 0.5), "after": probe(9.25, 0.45)}}]
    text = write_costs(sizes)
    assert "1gb 7.50 / 9.25 CPU-s per GB on the checkpoints' disk, 0.45 on /dev/shm. " in text
    sizes[1]["write_cost"]["before"]["memory"] = {"first_cpu_s_per_gb": 9.5}
    sizes[1]["write_cost"]["after"]["memory"] = {"first_cpu_s_per_gb": 0.12,
                                                 "again_cpu_s_per_gb": 0.05}
    assert ("0.45 on /dev/shm, first touch of new memory 9.50 / 0.12 CPU-s per GB (again: "
            "0.05)") in write_costs(sizes)
    assert "tiny" not in text
    for when, value in (("before", 0.04), ("after", 0.03)):
        sizes[1]["write_cost"][when]["storage_direct"] = {"cpu_s_per_gb": value}
    assert "7.50 / 9.25 (with O_DIRECT 0.04 / 0.03) CPU-s per GB" in write_costs(sizes)
    assert write_costs([{"size": "tiny"}]) == ""


def test_the_process_table_counts_a_truncated_role_with_its_full_name():
    from report.overhead import _roles  # noqa: PLC0415

    def proc(count, cpu):
        return {"count": count, "cpu_s": cpu, "rss_bytes": 1e9 * count,
                "cpu_per_step_s": cpu / 10, "core_share": cpu / 20}

    entry = {"size": "200mb", "runs": [{"arm": "ours", "accounting": {"processes": {
        "ray::WorkerActor": proc(1, 9.0), "ray::WorkerActo": proc(1, 8.0),
        "ray::Supervisor": proc(1, 0.5)}}}]}
    rows = _roles(entry, "ours")
    assert [r[1:3] for r in rows] == [["ray::WorkerActor", "2"], ["ray::Supervisor", "1"]]
    assert rows[0][3] == "1700 ms"


def test_saves_committed_count_durable_saves_only_and_show_each_runs_count():
    from overhead.ab import durable_saves  # noqa: PLC0415
    from report.overhead import _saves  # noqa: PLC0415

    timeline = {"saves": [{"step": 10, "tier": None}, {"step": 12, "tier": "local"},
                          {"step": 20, "tier": "storage"}, {"step": 30, "tier": None}],
                "commits": [{"step": 10, "tier": None}, {"step": 12, "tier": "local"},
                            {"step": 30, "tier": None}]}
    # the save of the last step (30, after the measured steps) is left out
    assert durable_saves({"timeline": timeline}, before_step=30) == {"requested": 2,
                                                                     "committed": 1}
    assert durable_saves({"timeline": None}, before_step=30) is None
    assert durable_saves({}, before_step=30) is None
    entry = {"runs": [{"arm": "ours", "durable_saves": {"requested": 2, "committed": 1}},
                      {"arm": "ours", "durable_saves": {"requested": 2, "committed": 2}},
                      {"arm": "ours", "durable_saves": None},
                      {"arm": "torchrun", "durable_saves": {"requested": 0, "committed": 0}}]}
    assert _saves(entry, "ours") == "1/2, 2/2"
    assert _saves(entry, "torchrun") == "–"


def test_an_arm_from_another_checkout_names_that_checkouts_commit():
    from report.overhead import _configuration  # noqa: PLC0415

    entry = {"durable_every": 8, "sitting": {"code": {"this": "abc", "before": "6ecbb81"}}}
    same = _configuration(entry, "ours-nolocal")
    assert "every 8 steps" in same and "commit" not in same
    other = _configuration(entry, "ours-nolocal@before")
    assert other.startswith(same) and other.endswith("commit 6ecbb81 (checkout 'before')")
    assert "unrecorded" in _configuration({"durable_every": 8}, "ours@after")


def test_before_and_after_pairs_each_arm_with_its_other_checkout_in_the_same_sitting():
    from report.overhead import checks_section  # noqa: PLC0415

    def paired(median):
        return {"wall_mean_s": {"median": median, "min": median - 0.02, "max": median + 0.01,
                                "n": 3}}

    entry = {"size": "1gb", "arms": {"ours-nolocal": {}, "ours-nolocal@before": {},
                                     "torchrun": {}, "ours@nowhere": {}},
             "paired": {"ours-nolocal vs ours-nolocal@before": paired(-0.067)},
             "sitting": {"date_utc": "2026-12-04 21:56 UTC", "reps": 3,
                         "code": {"this": "ae34b01", "before": "6ecbb81"}}}
    text = checks_section({"sizes": {"1gb": entry}}, [])
    assert "| overhead.json | 1gb | 2026-12-04 21:56 UTC | ours-nolocal (ae34b01) | " \
           "ours-nolocal@before (6ecbb81) | -6.7% (-8.7%–-5.7%) |" in text
    assert "ours@nowhere" not in text  # its base arm did not run in that sitting
    entry["arms"].pop("ours-nolocal@before")
    assert checks_section({"sizes": {"1gb": entry}}, []) == ""


def test_run_all_reruns_every_page_benchmark_with_the_pages_arms(monkeypatch):
    import run_all  # noqa: PLC0415
    from overhead.arms import PAGE_ARMS  # noqa: PLC0415

    calls = []
    monkeypatch.setattr(run_all.subprocess, "call", lambda cmd, cwd: calls.append(cmd[1:]) or 0)
    assert run_all.main(["--sizes", "tiny", "--reps", "2", "--out", "/tmp/rr-out"]) == 0
    scripts = [c[0].rsplit("/", 1)[1] for c in calls]
    assert scripts == ["bench_recovery.py", "bench_checkpoint.py", "bench_overhead.py",
                       "bench_tiers.py", "render.py"]
    overhead, tiers = calls[2], calls[3]
    assert overhead[overhead.index("--arms") + 1] == ",".join(PAGE_ARMS)
    assert overhead[overhead.index("--reps") + 1] == "2"
    assert "--reps" not in tiers and tiers[tiers.index("--sizes") + 1] == "tiny"


def test_first_steps_profile_sums_each_threads_cpu_between_logged_steps(tmp_path) -> None:
    """`first_saves.py`: a rank thread's name loses its rank suffix, a thread born between two
    logged steps counts from zero, and `--out` writes the same intervals as JSON."""
    from overhead import first_saves  # noqa: PLC0415 - its module sets up paths of its own

    def threads(step: int, t: float, copy: float, extra: list | None = None) -> dict:
        listed = [{"tid": 1, "name": "rr-train-r0", "cpu_s": 2.0 * step},
                  {"tid": 2, "name": "rr-ckpt-copy-r0", "cpu_s": copy}, *(extra or [])]
        return {"ev": "threads", "rank": 0, "step": step, "t": t, "threads": listed}

    run = str(tmp_path / "run")
    write_events(run, "rank0", [
        threads(1, 100.0, 0.0), threads(2, 110.0, 4.5),
        threads(4, 116.0, 4.75, [{"tid": 3, "name": "rr-ckpt-local-r0", "cpu_s": 0.25}])])
    rows = first_saves.intervals(run, 0)
    assert [(r["from"], r["to"], r["wall_s"]) for r in rows] == [(1, 2, 10.0), (2, 4, 6.0)]
    assert rows[0]["threads_cpu_s"] == {"rr-ckpt-copy": 4.5, "rr-train": 2.0}
    assert rows[1]["threads_cpu_s"] == {"rr-train": 4.0, "rr-ckpt-local": 0.25,
                                        "rr-ckpt-copy": 0.25}
    assert first_saves.line(rows[0]).startswith("rank 0 steps 1->2: wall  10.0 s, CPU   6.5 s")
    out = str(tmp_path / "out.json")
    args = first_saves.argparse.Namespace(mechanism="ours", size="1gb", durable=2, local=1,
                                          out=out, code="abc1234")
    assert first_saves.report(args, run, {"status": "ok", "usage": {"cpu_s": 12.0}}, 1,
                              started=1.0) == 0
    with open(out, encoding="utf-8") as f:
        written = json.load(f)
    assert written["intervals"] == rows and written["code"] == "abc1234"
    assert (written["durable_every"], written["local_every"], written["usage"]) == \
        (2, 1, {"cpu_s": 12.0})


def test_the_map_cost_probe_prices_every_way_of_mapping_a_buffer() -> None:
    costs = map_cost(16 * 2**20)
    assert set(costs) == {"new_memory", "same_mapping", "second_mapping",
                          "second_mapping_populated"}
    assert all(isinstance(cost, float) and cost >= 0 for cost in costs.values())
