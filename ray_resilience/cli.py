"""`ray-resilience` / `python -m ray_resilience`: the main job, benchmarks and tools.

    ray-resilience train [job args]          # the example job: HF Llama + FSDP2 (see --help)
    ray-resilience bench-recovery [args]     # jobs/bench/bench_recovery.py (source checkout)
    ray-resilience bench-checkpoint [args]   # jobs/bench/bench_checkpoint.py (source checkout)
    ray-resilience validate-manifests [DIR]  # KubeRay manifests against the CRDs and our rules
    ray-resilience show RUN_DIR              # a finished run's summary and goodput table
                                             # (a path, FSx or s3://bucket/prefix/<run name>)
"""

from __future__ import annotations

import json
import os
import runpy
import sys

JOBS = {"bench-recovery": "bench/bench_recovery.py",
        "bench-checkpoint": "bench/bench_checkpoint.py"}
"""Benchmarks: they compare against other frameworks' peers and ship with the source only."""
INSTALL_HINT = "pip install ray_resilience (with its dependencies)"


def _jobs_dir() -> str:
    """jobs/ of the source checkout this package runs from (or $RAY_RESILIENCE_JOBS_DIR)."""
    env = os.environ.get("RAY_RESILIENCE_JOBS_DIR")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jobs")


def _run_job(name: str, argv: list[str]) -> int:
    path = os.path.join(_jobs_dir(), JOBS[name])
    if not os.path.exists(path):
        print(f"{path} not found: run from a source checkout or set RAY_RESILIENCE_JOBS_DIR",
              file=sys.stderr)
        return 2
    sys.argv = [path, *argv]
    sys.path[:0] = [os.path.dirname(path), os.path.dirname(_jobs_dir())]
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    return 0


def _show(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: ray-resilience show RUN_DIR", file=sys.stderr)
        return 2
    from ray_resilience._internal.run_folder import read_text  # noqa: PLC0415 - pyarrow, only here

    try:
        results = json.loads(read_text(argv[0], "results.json"))
    except FileNotFoundError as err:
        print(f"{err}: is {argv[0]!r} a run folder (<storage_path>/<name>)?", file=sys.stderr)
        return 2
    except (OSError, ValueError) as err:
        print(f"cannot read {argv[0]!r}: {err}", file=sys.stderr)
        return 2
    summary = {k: results.get(k) for k in ("state", "error", "metrics", "attempts", "wall_s")}
    print(json.dumps(summary, indent=2, default=str))
    try:
        print(read_text(argv[0], "goodput.txt"))
    except FileNotFoundError:
        pass  # a run without a goodput report
    return 0


def _train(argv: list[str]) -> int:
    """Imported here: the example pulls torch and Ray, which the other commands do not need."""
    from ray_resilience.examples.train_llama import main as train  # noqa: PLC0415 - see above

    try:
        return train(argv)
    except SystemExit as exc:  # argparse: --help or a usage error
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2


def _validate_manifests(argv: list[str]) -> int:
    """Imported here: checking manifests needs neither torch nor ray, and an install made
    without its dependencies (`pip install --no-deps`) gets a one-line hint."""
    try:
        from ray_resilience.deploy import main as validate  # noqa: PLC0415 - see the docstring
    except ModuleNotFoundError as err:
        if (err.name or "").partition(".")[0] == "ray_resilience":
            raise
        print(f"error: validate-manifests needs the {err.name!r} module: "
              f"{INSTALL_HINT}", file=sys.stderr)
        return 2
    return validate(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "train":
        return _train(rest)
    if command in JOBS:
        return _run_job(command, rest)
    if command == "validate-manifests":
        return _validate_manifests(rest)
    if command == "show":
        return _show(rest)
    print(f"unknown command {command!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
