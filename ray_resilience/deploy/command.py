"""`validate-manifests`: the command-line face of the manifest validator; exit codes as linters
use them (0 valid, 1 problems, 2 the validator could not run).
"""

from __future__ import annotations

import argparse
import os
import sys

from ray_resilience.deploy.problems import ManifestProblem, ManifestValidationError
from ray_resilience.deploy.schemas import DEFAULT_KUBERNETES_VERSION
from ray_resilience.deploy.validate import manifest_files, validate_files

CRD_DIR_ENV_VAR = "RAY_RESILIENCE_KUBERAY_CRD_DIR"
JOBS_DIR_ENV_VAR = "RAY_RESILIENCE_JOBS_DIR"
# KubeRay v1.7.0's CRDs, shipped as package data (provenance and checksums in crds/SOURCE.md).
PACKAGED_CRD_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crds")


def default_crd_dir() -> str:
    """$RAY_RESILIENCE_KUBERAY_CRD_DIR if set, else the packaged KubeRay v1.7.0 CRDs."""
    return os.environ.get(CRD_DIR_ENV_VAR) or PACKAGED_CRD_DIR


def default_jobs_dir(paths: list[str]) -> str | None:
    """Where the entrypoints' job scripts are: $RAY_RESILIENCE_JOBS_DIR, ./jobs, or jobs/
    beside the first manifest folder."""
    first = os.path.abspath(paths[0]) if paths else os.getcwd()
    manifest_dir = first if os.path.isdir(first) else os.path.dirname(first)
    beside = os.path.join(manifest_dir, "..", "jobs")
    candidates = [os.environ.get(JOBS_DIR_ENV_VAR), "jobs", beside]
    return next((os.path.normpath(c) for c in candidates if c and os.path.isdir(c)), None)


def main(argv: list[str]) -> int:
    """`validate-manifests PATH... [--jobs-dir D] [--crd-dir D] [--kubernetes-version V]`.

    `argv` excludes the subcommand name. Returns 0 when valid, 1 on problems, 2 on usage errors.
    """
    parser = argparse.ArgumentParser(
        prog="python -m ray_resilience validate-manifests",
        description="Validate KubeRay RayJob/RayCluster/RayService and Kubernetes manifests.",
    )
    parser.add_argument("paths", nargs="+", help="manifest files or directories of *.yaml")
    parser.add_argument(
        "--jobs-dir",
        help=f"folder of job scripts (default: ${JOBS_DIR_ENV_VAR}, ./jobs, or jobs/ beside the "
        "manifest folder)",
    )
    parser.add_argument(
        "--crd-dir",
        default=default_crd_dir(),
        help=f"KubeRay CRD folder (default: ${CRD_DIR_ENV_VAR}, else the packaged v1.7.0 CRDs)",
    )
    parser.add_argument("--kubernetes-version", default=DEFAULT_KUBERNETES_VERSION)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    jobs_dir = args.jobs_dir or default_jobs_dir(args.paths)
    if jobs_dir is None:
        print(
            f"error: no jobs/ folder found (${JOBS_DIR_ENV_VAR}, ./jobs, or beside the "
            "manifest folder); pass --jobs-dir",
            file=sys.stderr,
        )
        return 2
    problems: list[ManifestProblem] = []
    try:
        # One set: a NetworkPolicy or claim in one file serves the RayJob in another.
        files = [f for p in args.paths for f in (manifest_files(p) if os.path.isdir(p) else [p])]
        problems = validate_files(
            files,
            jobs_dir=jobs_dir,
            crd_dir=args.crd_dir,
            kubernetes_version=args.kubernetes_version,
        )
    except ManifestValidationError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for problem in problems:
        print(problem)
    print(f"{len(problems)} problem(s)" if problems else "all manifests valid")
    return 1 if problems else 0
