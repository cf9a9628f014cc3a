"""The committed recovery results are scored by the current scoring code: a change of a
definition must re-score them (`jobs/bench/rescore.py`) from their committed timelines before it
lands, so the page never shows numbers the code would no longer produce."""

from __future__ import annotations

import copy
import glob
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "jobs", "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import rescore  # noqa: E402 - after the path set-up above
from sweep.results import read_json, write_gz, write_json  # noqa: E402

pytestmark = pytest.mark.timeout(120)

RESULTS = sorted(glob.glob(os.path.join(ROOT, "docs", "benchmarks", "recovery-*.json")))


def test_every_committed_recovery_result_is_what_its_timelines_score_to() -> None:
    assert RESULTS, "docs/benchmarks/ holds the recovery results behind the page"
    for path in RESULTS:
        doc = read_json(path)
        scored = copy.deepcopy(doc)
        moved = rescore.rescore(scored, read_json(rescore.timelines_path(path)))
        assert moved == [], f"{path}: run `python jobs/bench/rescore.py {path}`: {moved[:3]}"
        assert rescore._canonical(scored["scenarios"]) == rescore._canonical(doc["scenarios"])


def _small_copy(tmp_path, size: str = "tiny") -> str:
    """The committed result of one size, cut to its node-loss scenario, in `tmp_path`."""
    src = os.path.join(ROOT, "docs", "benchmarks", f"recovery-{size}.json")
    doc = read_json(src)
    doc["scenarios"] = {"node_loss": doc["scenarios"]["node_loss"]}
    doc.pop("rescored", None)
    path = str(tmp_path / f"recovery-{size}.json")
    write_json(path, doc)
    write_gz(rescore.timelines_path(path), read_json(rescore.timelines_path(src)))
    return path


def test_a_stale_score_is_found_rewritten_with_its_summary_and_the_rescore_recorded(
        tmp_path) -> None:
    path = _small_copy(tmp_path)
    doc = read_json(path)
    row = next(r for r in doc["scenarios"]["node_loss"]["runs"] if r["mechanism"] == "ours")
    truth = row["score"]["steps_redone"]
    row["score"]["steps_redone"] = truth + 100
    doc["scenarios"]["node_loss"]["summary"]["ours"]["steps_redone"]["median"] = truth + 100
    write_json(path, doc)

    assert rescore.main(["--check", path]) == 1
    assert read_json(path) == doc  # --check writes nothing
    assert rescore.main([path, "--note", "test"]) == 0
    fixed = read_json(path)
    row = next(r for r in fixed["scenarios"]["node_loss"]["runs"] if r["mechanism"] == "ours")
    assert row["score"]["steps_redone"] == truth
    assert fixed["scenarios"]["node_loss"]["summary"]["ours"]["steps_redone"]["median"] == truth
    (entry,) = fixed["rescored"]
    assert entry["fields"] == ["steps_redone"] and entry["note"] == "test"
    assert rescore.main(["--check", path]) == 0  # now current; a second run records nothing
    assert rescore.main([path]) == 0 and len(read_json(path)["rescored"]) == 1


def test_a_run_without_exactly_one_timeline_is_refused(tmp_path) -> None:
    path = _small_copy(tmp_path)
    timelines = read_json(rescore.timelines_path(path))
    key = next(k for k in timelines if k.endswith("-ours-node_loss-rep0"))
    timelines[f"999-{key.split('-', 1)[1]}"] = timelines[key]
    with pytest.raises(ValueError, match="2 timelines match the run 'ours-node_loss-rep0'"):
        rescore.rescore(read_json(path), timelines)
