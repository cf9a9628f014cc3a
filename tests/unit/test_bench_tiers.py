"""The recovery-tier part of docs/benchmarks.md renders every number from `tiers.json`."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "jobs", "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

from report import tiers  # noqa: E402 - after the path set-up above
from tiers.runs import step_seconds  # noqa: E402

pytestmark = pytest.mark.timeout(60)


def _run(**fields):
    base = {"ok": True, "error": None, "step_s": None, "interval_steps": None,
            "local_cost_s": None, "local_step_s": None, "local_snapshots": None,
            "local_blocking_s": None, "fault": None}
    return {**base, **fields}


def test_the_section_shows_the_measured_numbers():
    doc = {"date_utc": "2030-01-01 00:00 UTC", "checksum_gb_s": {"crc32c": 11.2,
                                                                 "zlib_crc32": 1.6},
           "sizes": [{"size": "200mb", "state_bytes_per_rank": 190e6, "runs": {
               "off": _run(step_s=0.400),
               "auto": _run(step_s=0.404, interval_steps=25, local_cost_s=0.1, local_step_s=0.4,
                            local_snapshots=4, local_blocking_s=0.02,
                            fault={"step": 34, "resumed_from": 33, "steps_redone": 1,
                                   "recovery_s": 2.5, "load_s": 0.6}),
               "memory": _run(fault={"load_s": 0.9}),
               "storage": _run(ok=False, error="boom", fault={"load_s": 3.1})}}]}
    text = tiers.section(doc)
    row = "| 200mb | 190 MB | 25 | 100.0 ms | 5.0 ms | 400.0 ms | 404.0 ms | 1.0% | 1.00% |"
    assert row in text
    assert "| 200mb | 34 | 33 | 1 | 2.50 s | 0.60 s | 0.90 s | 3.10 s |" in text
    assert "CRC-32C 11.2 GB/s" in text and "200mb storage: boom" in text


def test_step_time_is_rank_0s_median_over_the_window():
    history = [{"rank": r, "attempt": 0, "step": s, "time": 10.0 + s * (1 + r)}
               for r in (0, 1) for s in range(1, 9)]
    history.append({"rank": 0, "attempt": 1, "step": 9, "time": 99.0})
    assert step_seconds(history, 3, 8) == pytest.approx(1.0)
