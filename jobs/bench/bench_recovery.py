"""Recovery benchmark: the same workload and fault plans through every recovery mechanism.

    python jobs/bench/bench_recovery.py --quick                      # tiny size, 1 repetition
    python jobs/bench/bench_recovery.py --out docs/benchmarks        # 3 sizes, 3 repetitions

FSDP2 LLaMA with dropout on 2 CPU ranks (gloo) at three state sizes per rank, the AWS/NVRx
schedule generator's plans (`sweep/plans.py`), every mechanism at its best (`peers/`), scored
with one yardstick (`scoring/yardstick.py`) and charged its processes' memory and CPU. Per size
it writes `recovery-<size>.json` (configuration, calibration, intervals, references, per-run
rows, per-mechanism summaries) and `recovery-<size>.timelines.json.gz` (every run's timeline)
into --out; `render.py` turns them into docs/benchmarks.md. See sweep/recovery.py for the
phases of a sweep.

A sweep that must stop (`--stop-at`, a session's end, a crash) keeps every finished run in
`<work>/<size>/journal.jsonl` beside its run folders; the same command with `--resume` goes on
from there (same --work and settings), so a size that takes hours can run in sittings:

    python jobs/bench/bench_recovery.py --sizes 1gb --out /tmp/s1 --work /tmp/w1 --stop-at 20:40
    python jobs/bench/bench_recovery.py --sizes 1gb --out /tmp/s1 --work /tmp/w1 --resume
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [BENCH, os.path.dirname(os.path.dirname(BENCH))]

from harness.sizes import SIZES  # noqa: E402 - after the path set-up above
from overhead.rebuild_probe import KEEP_ENV  # noqa: E402
from peers import MECHANISMS, SWEPT  # noqa: E402
from sweep import machine  # noqa: E402
from sweep.journal import JournalMismatch, SweepPaused  # noqa: E402
from sweep.plans import SCENARIOS  # noqa: E402
from sweep.recovery import SizeSweep, SweepConfig  # noqa: E402
from sweep.results import write_gz, write_json  # noqa: E402


def _names(text: str, choices: object, flag: str,
           parser: argparse.ArgumentParser) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in choices]
    if unknown:
        parser.error(f"{flag}: unknown {unknown}; choose from {', '.join(choices)}")
    return names


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="tiny size, short runs, 1 repetition (overrides the defaults below)")
    p.add_argument("--sizes", default=None, help=f"comma-separated from {', '.join(SIZES)}")
    p.add_argument("--scenarios", default=",".join(SCENARIOS),
                   help=f"comma-separated from {', '.join(SCENARIOS)}")
    p.add_argument("--side-sizes", default="tiny",
                   help="sizes that also run the hang and node-loss scenarios")
    p.add_argument("--mechanisms", default=",".join(SWEPT),
                   help=f"comma-separated from {', '.join(MECHANISMS)}")
    p.add_argument("--reps", type=int, default=None,
                   help="repetitions of the AWS scenario (default 3; --quick: 1)")
    p.add_argument("--ref-reps", type=int, default=None,
                   help="repetitions of the fault-free reference run (default 3; --quick: 1), "
                        "interleaved with the AWS scenario's")
    p.add_argument("--side-reps", type=int, default=1,
                   help="repetitions of the hang and node-loss scenarios")
    p.add_argument("--out", default=None, help="result folder (default results/bench/<time>)")
    p.add_argument("--work", default=None, help="scratch folder for run folders "
                                                "(default /tmp/rrbench-<time>)")
    p.add_argument("--run-timeout-s", type=float, default=1200.0)
    p.add_argument("--keep-freed-memory", action="store_true",
                   help="run every mechanism's processes with glibc told to keep freed memory "
                        "(overhead/rebuild_probe.py's KEEP_ENV, in the environment each run "
                        "inherits; docs/design.md, section 8); default: glibc as it comes")
    p.add_argument("--resume", action="store_true",
                   help="go on with the sweep whose journal is in --work (needs --work as "
                        "given before)")
    p.add_argument("--stop-at", default=None, metavar="HH:MM",
                   help="UTC time after which no new run starts (the next occurrence); the "
                        "sweep stops after the run in progress and can be resumed")
    args = p.parse_args(argv)
    if args.resume and not args.work:
        p.error("--resume needs --work, the scratch folder of the sweep it goes on with")
    args.deadline = _deadline(args.stop_at, p) if args.stop_at else None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.sizes = _names(args.sizes or ("tiny" if args.quick else ",".join(SIZES)), SIZES,
                        "--sizes", p)
    args.scenarios = _names(args.scenarios, SCENARIOS, "--scenarios", p)
    args.side_sizes = _names(args.side_sizes, SIZES, "--side-sizes", p)
    args.mechanisms = _names(args.mechanisms, MECHANISMS, "--mechanisms", p)
    args.reps = args.reps or (1 if args.quick else 3)
    args.ref_reps = args.ref_reps or (1 if args.quick else 3)
    if min(args.reps, args.side_reps, args.ref_reps) < 1:
        p.error(f"--reps={args.reps}, --ref-reps={args.ref_reps} and "
                f"--side-reps={args.side_reps} must be >= 1")
    args.out = os.path.abspath(args.out or os.path.join("results", "bench", stamp))
    args.work = os.path.abspath(args.work or f"/tmp/rrbench-{stamp}")
    return args


def _deadline(text: str, parser: argparse.ArgumentParser) -> float:
    try:
        at = datetime.datetime.strptime(text, "%H:%M").time()
    except ValueError:
        parser.error(f"--stop-at={text!r}: give a UTC time as HH:MM, e.g. 20:40")
    now = datetime.datetime.now(datetime.UTC)
    when = now.replace(hour=at.hour, minute=at.minute, second=0, microsecond=0)
    if when <= now:
        when += datetime.timedelta(days=1)
    return when.timestamp()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python jobs/bench/bench_recovery.py " + shlex.join(sys.argv[1:] if argv is None
                                                                   else argv)
    allocator_env = dict(KEEP_ENV) if args.keep_freed_memory else {}
    os.environ.update(allocator_env)  # every run's processes inherit it, every mechanism's alike
    for name in args.sizes:
        scenarios = tuple(s for s in args.scenarios if s == "aws" or name in args.side_sizes)
        cfg = SweepConfig(mechanisms=args.mechanisms, scenarios=scenarios, reps=args.reps,
                          ref_reps=args.ref_reps, side_reps=args.side_reps, quick=args.quick,
                          work_dir=args.work,
                          run_timeout_s=args.run_timeout_s,
                          resume=args.resume, deadline=args.deadline)
        info = machine.describe(command)
        started = time.time()
        try:
            sweep = SizeSweep(cfg, name, log=lambda line: print(line, flush=True))
            body = sweep.run()
        except JournalMismatch as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except SweepPaused as exc:
            print(f"[{name}] {exc}", flush=True)
            return 3
        document = {"benchmark": "recovery", **info, **body, "allocator_env": allocator_env,
                    "duration_s": round(time.time() - started, 1), **sweep.sittings()}
        document["machine"]["load_average_at_end"] = round(os.getloadavg()[0], 2)
        print(f"wrote {write_json(os.path.join(args.out, f'recovery-{name}.json'), document)}")
        write_gz(os.path.join(args.out, f"recovery-{name}.timelines.json.gz"), sweep.timelines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
