"""The fault-free overhead section of docs/benchmarks.md (from `overhead.json`,
bench_overhead.py): ours' per-step cost against no resilience and against plain torchrun."""

from __future__ import annotations

import statistics
from typing import Any

from .fmt import NONE, mb, ms, pct, sec, spread, table

LATE = "wall_late_mean_s"
"""The mean step over the second half of a run's measured steps (`overhead/steps.py`)."""

CONFIGS = {
    "torchrun": "the loop under torchrun, no checkpoints",
    "ours-disabled": "ResilienceConfig.disabled(): Ray actors, nothing recovering, no checkpoints",
    "ours": "ResilienceConfig.default(): checkpoints every {durable} steps, local tier \"auto\"",
    "ours-nockpt": "ResilienceConfig.default() with nothing saved: every rung running, no "
                   "checkpoints, local tier off",
    "ours-nolocal": "ResilienceConfig.default(): checkpoints every {durable} steps, local tier "
                    "off",
    "torchrun-dcp": "the loop under torchrun, DCP async_save every {durable} steps (thread "
                    "checkpointer on its own gloo group, async staging into shared memory, plan "
                    "caching; a save waits for the previous one), no local tier",
}
BUDGET_VS_NONE = 0.01
"""Target: the defaults cost at most 1% per step against no resilience (ours-disabled)."""
BUDGET_VS_TORCHRUN = 0.02
"""Target: ours' fault-free step within 2% of plain torchrun's."""
SIZE_ORDER = ("tiny", "200mb", "1gb")
THREADS_SHOWN = 10
"""Rank threads per size in the thread table, the busiest first."""


def _paired(entry: dict[str, Any], a: str, b: str, kind: str) -> dict[str, Any] | None:
    return (entry["paired"].get(f"{a} vs {b}") or {}).get(kind)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _totals(entry: dict[str, Any], arm: str) -> tuple[float | None, float | None]:
    """Median over repetitions of the CPU per step summed over every process, and of the run's
    peak memory: private memory plus shared memory counted once (a rank's staging slot that its
    writer maps too is one buffer, not two; the per-process RSS sum counts it twice)."""
    cpu, memory = [], []
    for run in entry["runs"]:
        acc = run.get("accounting")
        if run["arm"] == arm and acc and acc["processes"]:
            cpu.append(sum(p["cpu_per_step_s"] for p in acc["processes"].values()))
        peak = (run.get("usage") or {}).get("peak_memory_bytes")
        if run["arm"] == arm and run.get("status") == "ok" and peak:
            memory.append(peak)
    return _median(cpu), _median(memory)


def _intervals(entry: dict[str, Any], arm: str) -> str:
    chosen = sorted({r["local_interval_steps"] for r in entry["runs"]
                     if r["arm"] == arm and r.get("local_interval_steps")})
    return ", ".join(map(str, chosen)) if chosen else NONE


def _saves(entry: dict[str, Any], arm: str) -> str:
    """Committed / requested durable saves of each run of `arm` (– for sittings before the
    count, and for arms that save nothing)."""
    counts = [r["durable_saves"] for r in entry["runs"]
              if r["arm"] == arm and r.get("durable_saves")]
    shown = sorted({f"{c['committed']}/{c['requested']}" for c in counts if c["requested"]})
    return ", ".join(shown) if shown else NONE


def _configuration(entry: dict[str, Any], arm: str) -> str:
    """How `arm` ran; an arm from another checkout (`NAME@LABEL`) names that checkout's commit."""
    config = CONFIGS.get(arm.split("@")[0], arm).format(durable=entry["durable_every"])
    label = arm.partition("@")[2]
    if label:
        commit = entry.get("sitting", {}).get("code", {}).get(label)
        config += f"; the library at commit {commit or 'unrecorded'} (checkout {label!r})"
    return config


def _row(entry: dict[str, Any], arm: str) -> list[str]:
    s = entry["arms"][arm]
    cpu, memory = _totals(entry, arm)
    config = _configuration(entry, arm)
    return [entry["size"], arm, f"{s['ok']}/{s['runs']}",
            spread(s["wall_median_s"], ms), spread(s["wall_mean_s"], ms),
            spread(_paired(entry, arm, "torchrun", "wall_mean_s")),
            spread(_paired(entry, arm, "ours-disabled", "wall_mean_s")),
            spread(_paired(entry, arm, "torchrun", LATE)),
            _saves(entry, arm), _intervals(entry, arm), spread(s["startup"]["total"], sec),
            ms(cpu), mb(None if memory is None else memory / 1e6), config]


COMM_MAX = 15
"""The kernel's limit on a process name, which `harness.resources.role` falls back to for a process
that is exiting (the report does not import the harness: rendering needs no psutil)."""
_ADDITIVE = ("count", "cpu_s", "rss_bytes", "cpu_per_step_s", "core_share")


def _untruncated(procs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Roles with a process listed under its kernel name cut to 15 characters (it exited while
    sampled: sittings before the harness kept the full role) counted with the full role."""
    out = {role: dict(p) for role, p in procs.items()}
    for role in list(out):
        full = [other for other in out if other != role and other.startswith(role)]
        if len(role) == COMM_MAX and len(full) == 1:
            cut = out.pop(role)
            for key in _ADDITIVE:
                out[full[0]][key] += cut[key]
    return out


def _roles(entry: dict[str, Any], arm: str) -> list[list[str]]:
    """Per process role of `arm`'s first complete run: count, CPU per step, share, RSS."""
    run = next((r for r in entry["runs"] if r["arm"] == arm and r.get("accounting")), None)
    if run is None:
        return []
    procs = _untruncated(run["accounting"]["processes"])
    return [[entry["size"], role, str(p["count"]), ms(p["cpu_per_step_s"]), pct(p["core_share"]),
             mb(p["rss_bytes"] / 1e6)]
            for role, p in sorted(procs.items(), key=lambda kv: -kv[1]["cpu_s"])]


def _threads(entry: dict[str, Any], arm: str) -> list[list[str]]:
    run = next((r for r in entry["runs"] if r["arm"] == arm and r.get("accounting")), None)
    if run is None:
        return []
    busiest = sorted(run["accounting"]["rank_threads"].items(),
                     key=lambda kv: (-kv[1]["cpu_per_step_s"], kv[0]))[:THREADS_SHOWN]
    return [[entry["size"], name, str(t["count"]), ms(t["cpu_per_step_s"]),
             f"{t['switches_per_step']:.1f}", ",".join(map(str, t["nice"]))]
            for name, t in busiest]


def _sizes(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The document's sizes, smallest first."""
    return sorted(doc["sizes"].values(), key=lambda e: SIZE_ORDER.index(e["size"])
                  if e["size"] in SIZE_ORDER else len(SIZE_ORDER))


def _sittings(doc: dict[str, Any], sizes: list[dict[str, Any]]) -> str:
    """When each size was measured and how often: one sitting, or one clause per sitting."""
    by_sitting: dict[tuple, list[str]] = {}
    for entry in sizes:
        own = entry.get("sitting", doc)
        key = (own["date_utc"], own["reps"])
        by_sitting.setdefault(key, []).append(entry["size"])
    return "; ".join(f"{', '.join(names)}: {date}, {reps} repetitions"
                     for (date, reps), names in by_sitting.items())


def verdicts(doc: dict[str, Any]) -> list[str]:
    """Per size, the two targets against the paired medians of the mean step time."""
    out = []
    for entry in _sizes(doc):
        vs_none = _paired(entry, "ours", "ours-disabled", "wall_mean_s")
        vs_torchrun = _paired(entry, "ours", "torchrun", "wall_mean_s")
        parts = []
        for label, got, budget in (("vs no resilience", vs_none, BUDGET_VS_NONE),
                                   ("vs torchrun", vs_torchrun, BUDGET_VS_TORCHRUN)):
            if not got:
                parts.append(f"{label}: not measured")
                continue
            met = "met" if got["median"] <= budget else "missed"
            parts.append(f"{label} {pct(got['median'])} (target <= {pct(budget, 0)}: {met})")
        out.append(f"{entry['size']}: " + "; ".join(parts))
    return out


SPLIT = (
    ("Ray hosting and our rank machinery", "ours-disabled", "torchrun"),
    ("the recovery rungs' machinery", "ours-nockpt", "ours-disabled"),
    ("committed checkpoints", "ours-nolocal", "ours-nockpt"),
    ("the same saves with DCP async under torchrun", "torchrun-dcp", "torchrun"),
    ("the local tier", "ours", "ours-nolocal"),
)
"""Where ours' step cost goes: each part is an arm against the arm without that part."""


def split_rows(entry: dict[str, Any]) -> list[list[str]]:
    """The SPLIT parts measured at a size (both arms run in the same sitting)."""
    rows = []
    for part, arm, without in SPLIT:
        got = _paired(entry, arm, without, "wall_mean_s")
        if got:
            rows.append([entry["size"], part, f"{arm} vs {without}", spread(got, pct),
                         spread(_paired(entry, arm, without, LATE), pct)])
    return rows


def write_costs(sizes: list[dict[str, Any]]) -> str:
    """What writing new files (and, in later sittings, touching new memory) cost the machine
    around each size's sitting (before / after its runs), or "" when no sitting measured it."""
    parts = []
    for entry in sizes:
        cost = entry.get("write_cost")
        if cost:
            disk = " / ".join(f"{cost[when]['storage']['cpu_s_per_gb']:.2f}"
                              for when in ("before", "after"))
            memory = ""
            if "memory" in cost["before"]:
                first = " / ".join(f"{cost[when]['memory']['first_cpu_s_per_gb']:.2f}"
                                   for when in ("before", "after"))
                memory = (f", first touch of new memory {first} CPU-s per GB (again: "
                          f"{cost['after']['memory']['again_cpu_s_per_gb']:.2f})")
            if "storage_direct" in cost["before"]:
                direct = " / ".join(f"{cost[when]['storage_direct']['cpu_s_per_gb']:.2f}"
                                    for when in ("before", "after"))
                disk = f"{disk} (with O_DIRECT {direct})"
            parts.append(f"{entry['size']} {disk} CPU-s per GB on the checkpoints' disk, "
                         f"{cost['after']['tmpfs']['cpu_s_per_gb']:.2f} on /dev/shm{memory}")
    if not parts:
        return ""
    return ("What new files and new memory cost this machine (`sweep/machine.py` `write_cost` "
            "and `touch_cost`, before / after each size's runs): " + "; ".join(parts) + ". "
            "Both swing with what ran before: this virtual machine charges a first touch of "
            "memory it has not used lately far more than a second. On 2 cores that CPU is taken "
            "from training, so a save costs here mostly by the new memory it touches "
            "(`overhead/profile_save.sh`; docs/design.md, section 7). DCP async stages into "
            "buffers it reuses and leaves its files in the page cache. Ours' writer adopts each "
            "save's staging memory from the rank, keeps the newest commit there as the memory "
            "tier and gives a buffer back once a newer commit frees it, so a run's second save "
            "touches one state size more new memory than DCP's (since ae34b01; in sittings on "
            "older code the writer copied each save into a buffer of its own: up to two state "
            "sizes more), and it drops each written file from the page cache, so a save's files "
            "reuse the memory the previous one's freed (since bd46972); since fc485d5 it writes "
            "its data files with O_DIRECT, past the page cache (`CheckpointConfig.direct_io`).")


def section(doc: dict[str, Any]) -> str:
    sizes = _sizes(doc)
    if not sizes:
        return NONE
    arms = doc["arms"]
    lines = [
        "## Fault-free overhead", "",
        f"From `jobs/bench/bench_overhead.py` ({_sittings(doc, sizes)}): the same loop on 2 CPU "
        "ranks (gloo), no faults, interleaved repetitions (the arms' order rotates "
        "every repetition). Step: wall time per training step, averaged over ranks, after the "
        "warm-up steps; the mean includes the periodic saves (committed checkpoints, the local "
        "tier) at the steps they happen, so it is the figure the targets are judged on. "
        "2nd half: the mean step over the second half of the measured steps, where one-time "
        "costs (the first saves' allocations, the prestarted worker's import of torch) are "
        "behind: closer to what a long run pays per step (– where the sitting predates it). "
        "Against: the median over repetitions of (arm / other - 1) with both runs from the same "
        "repetition, which cancels most of the shared machine's drift. Saves committed: durable "
        "checkpoints committed / asked for in each run (every saving arm must do the same "
        "work). CPU and memory: every "
        "process the run started, summed, between two steps after the warm-up (CPU per training "
        "step); peak memory: the run's largest private memory of those processes plus the growth "
        "of the machine's shared memory since the run started (/proc/meminfo Shmem), so a "
        "staging buffer a rank and its writer both map counts once; the median over "
        "repetitions.", "",
        table(["size", "arm", "ok", "step, median", "step, mean", "vs torchrun",
               "vs ours-disabled", "vs torchrun, 2nd half", "saves committed", "local interval",
               "start-up",
               "CPU per step", "peak memory",
               "configuration"],
              [_row(e, a) for e in sizes for a in arms if a in e["arms"]]), "",
        "Targets (paired medians of the mean step): " + "; ".join(verdicts(doc)) + ".", "",
        "Where ours' extra step time goes: each part is the arm with it against the arm "
        "without it (paired medians of the mean step, min-max over repetitions; sizes whose "
        "sitting ran both arms):", "",
        table(["size", "part", "arms", "mean step, more by", "in the run's 2nd half"],
              [row for e in sizes for row in split_rows(e)]), "",
        *([write_costs(sizes), ""] if write_costs(sizes) else []),
        "Where ours' CPU and memory go (its first complete run per size), per process (RSS "
        "counts a shared page in every process that maps it; `default_worker.py` is a Ray "
        "worker process no actor has claimed: ours' prestarted worker "
        "(`InJobConfig.num_prestarted_workers`) importing torch on an idle-priority thread, "
        "once per run):", "",
        table(["size", "process", "count", "CPU per step", "share of a core", "RSS"],
              [row for e in sizes for row in _roles(e, "ours")]), "",
        f"and the {THREADS_SHOWN} busiest threads of the two rank processes (summed over ranks; "
        "`nice` as the kernel reports it: Ray starts its workers at nice 15):", "",
        table(["size", "thread", "count", "CPU per step", "switches per step", "nice"],
              [row for e in sizes for row in _threads(e, "ours")]),
    ]
    return "\n".join(lines)


def checks_section(doc: dict[str, Any] | None, checks: list[tuple[str, dict[str, Any]]]) -> str:
    """Before/after checks: every arm run from another checkout (`NAME@LABEL`) against `NAME` from
    the same sitting, in the page's sitting (`doc`) and in check sittings (`checks`: (file name,
    document)), with each check sitting's rows."""
    rows, parts = [], []
    sources = ([("overhead.json", doc)] if doc else []) + list(checks)
    for name, source in sources:
        for entry in _sizes(source):
            own = entry.get("sitting", source)
            code = own.get("code", {})
            for arm in entry["arms"]:
                base, _, label = arm.partition("@")
                if not label or base not in entry["arms"]:
                    continue
                rows.append([name, entry["size"], own["date_utc"], f"{base} ({code.get('this')})",
                             f"{arm} ({code.get(label)})",
                             spread(_paired(entry, base, arm, "wall_mean_s")),
                             spread(_paired(entry, base, arm, LATE)),
                             spread(_paired(entry, base, arm, "process_cpu_mean_s"))])
    for name, source in checks:
        for entry in _sizes(source):
            parts += [f"`{name}` ({_sittings(source, [entry])}; "
                      f"`{entry.get('sitting', source)['command']}`):", "",
                      table(["size", "arm", "ok", "step, median", "step, mean", "vs torchrun",
                             "vs ours-disabled", "vs torchrun, 2nd half", "saves committed",
                             "local interval", "start-up", "CPU per step", "peak memory",
                             "configuration"],
                            [_row(entry, a) for a in source["arms"] if a in entry["arms"]]), ""]
    if not rows:
        return ""
    return "\n".join([
        "### Before and after", "",
        "A change's effect, measured in one sitting: the library at the new commit against the "
        "same arm at an older commit (`--arms NAME@LABEL --checkout LABEL=PATH`), interleaved "
        "like the page's arms (paired medians of the new against the old, min-max over "
        "repetitions). Sittings kept for this alone live in `docs/benchmarks/overhead-checks/`.",
        "",
        table(["results", "size", "sitting", "new", "old", "mean step", "mean step, 2nd half",
               "CPU per step"], rows), "",
        *parts]).rstrip()
