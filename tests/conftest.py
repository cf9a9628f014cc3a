"""Shared fixtures: one private local Ray per test session (never a cluster we did not start)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# Plug-in fixture modules (each owns its own server or cluster).
pytest_plugins: list[str] = ["tests.support.s3_server"]


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray started by this test session, with its own temp dir; shut down at the end.

    Declares 4 logical CPUs on this 2-core machine so two 1-CPU workers, the supervisor and the
    checkpoint writers fit at once.
    """
    import ray  # noqa: PLC0415 - tests/deploy run without ray

    if ray.is_initialized():
        yield ray
        return
    os.environ.pop("RAY_ADDRESS", None)  # never attach to a cluster the tests did not start
    temp_dir = tempfile.mkdtemp(prefix="rr-ray-", dir="/tmp")
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        _temp_dir=temp_dir,
        configure_logging=False,
        log_to_driver=True,
        runtime_env={"env_vars": {"PYTHONPATH": ROOT}},
    )
    try:
        yield ray
    finally:
        # Checkpoint tests reuse their ranks across tests and modules (see checkpoint_harness.py:
        # a parked rank holds no CPU and starts over from the seed); they go before Ray does.
        harness = sys.modules.get("tests.support.checkpoint_harness")
        if harness is not None:
            harness.drain_parked()
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def token_data_dir(tmp_path_factory) -> str:
    """The example token dataset, generated once per session."""
    from ray_resilience.examples.token_data import generate_shards  # noqa: PLC0415 - tests/deploy run without torch

    path = str(tmp_path_factory.mktemp("token-data"))
    generate_shards(path)
    return path


@pytest.fixture(scope="session")
def clean_run(ray_session, token_data_dir, tmp_path_factory):
    """`clean_run(num_workers=2, max_steps=12)`: the fault-free run of tests/support/workload.py
    that fault runs must end bit-equal to (the oracle), trained once per session per shape and
    shared by every module (each costs a run: actor start-up, imports, training)."""
    from tests.support import workload  # noqa: PLC0415 - tests/deploy run without torch

    runs: dict[tuple[int, int], object] = {}

    def get(num_workers: int = 2, max_steps: int = 12):
        key = (num_workers, max_steps)
        if key not in runs:
            result = workload.fit(token_data_dir, str(tmp_path_factory.mktemp("clean")),
                                  f"clean-{num_workers}x{max_steps}", num_workers=num_workers,
                                  max_steps=max_steps)
            assert result.ok, result.error
            runs[key] = result
        return runs[key]

    return get
