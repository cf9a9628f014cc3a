"""A rank process's start-up phases: the boot phase is always recorded, even when /proc's
whole-second boot time makes the process look younger than its actor's `__init__`."""

from __future__ import annotations

import pytest

from ray_resilience._internal.rank.worker import Worker

pytestmark = pytest.mark.timeout(60)


def _phases(t_process: float | None, t_init: float, t_imported: float) -> dict[str, tuple]:
    worker = Worker(lambda: None, None, supervisor=None)
    worker.note_startup(t_process, t_init, t_imported)
    return {p["phase"]: (p["t_start"], p["t_end"]) for p in worker._startup}


def test_boot_and_imports_are_timed_in_order() -> None:
    assert _phases(99.5, 100.0, 102.0) == {"process_start": (99.5, 100.0),
                                           "imports": (100.0, 102.0)}


def test_a_boot_time_read_after_init_is_a_boot_too_short_to_measure() -> None:
    assert _phases(100.4, 100.0, 102.0)["process_start"] == (100.0, 100.0)


def test_no_proc_filesystem_times_imports_only() -> None:
    assert _phases(None, 100.0, 102.0) == {"imports": (100.0, 102.0)}
