"""A job-level worker setup hook for tests/ray/test_prestart.py: marks the process it ran in."""

import os


def mark() -> None:
    os.environ["RR_HOOK_PROBE"] = "ran"
