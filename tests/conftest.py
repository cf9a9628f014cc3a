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
pytest_plugins: list[str] = ["tests.s3_server"]


@pytest.fixture(scope="module", autouse=True)
def _drain_parked_ranks():
    """Checkpoint tests reuse their ranks within a module (tests/checkpoint_harness.py)."""
    yield
    harness = sys.modules.get("tests.checkpoint_harness")
    if harness is not None:
        harness.drain_parked()


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray started by this test session, with its own temp dir; shut down at the end.

    Declares 4 logical CPUs on this 2-core machine so two 1-CPU workers, the supervisor and the
    checkpoint writers fit at once.
    """
    import ray

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
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def token_data_dir(tmp_path_factory) -> str:
    """The example token dataset, generated once per session."""
    from ray_resilience.examples.token_data import generate_shards

    path = str(tmp_path_factory.mktemp("token-data"))
    generate_shards(path)
    return path
