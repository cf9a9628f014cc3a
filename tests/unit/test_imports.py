"""Import hygiene: the public names resolve, the control plane imports no torch."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("module", ["ray_resilience", "ray_resilience.callbacks",
                                    "ray_resilience.checkpoint",
                                    "ray_resilience.goodput", "ray_resilience.policy",
                                    "ray_resilience.testing"])
def test_public_names_resolve(module):
    package = importlib.import_module(module)
    assert package.__all__ == sorted(package.__all__, key=str.lower)
    assert all(getattr(package, name) is not None for name in package.__all__)


def test_control_plane_imports_no_torch():
    """The supervisor, the commit coordinator and the writers start without torch (3-5 s each)."""
    code = ("import sys, ray_resilience._internal.supervisor.supervisor, ray_resilience.trainer, "
            "ray_resilience._internal.checkpoint.service.coordinator, "
            "ray_resilience._internal.checkpoint.service.writer, "
            "ray_resilience._internal.rank.actor; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
