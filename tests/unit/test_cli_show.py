"""`ray-resilience show RUN_DIR` reads a run folder through pyarrow.fs."""

from __future__ import annotations

import json

from ray_resilience.cli import main


def test_show_prints_the_summary_and_the_goodput_table(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({"state": "finished", "attempts": 2}))
    (run / "goodput.txt").write_text("goodput 97.5%\n")
    assert main(["show", str(run)]) == 0
    out = capsys.readouterr().out
    assert '"state": "finished"' in out and "goodput 97.5%" in out


def test_show_of_a_folder_without_results_says_so(tmp_path, capsys):
    assert main(["show", str(tmp_path)]) == 2
    assert "results.json not found" in capsys.readouterr().err
