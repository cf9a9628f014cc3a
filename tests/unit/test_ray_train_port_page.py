"""docs/ray_train_port.md shows the real diff of the two files it is about."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ORIGINAL = "jobs/ray_train_port/ray_train_fsdp.py"
PORT = "jobs/ray_train_port/resilient_fsdp.py"

pytestmark = pytest.mark.timeout(30)


def test_the_page_shows_the_unified_diff_of_the_original_and_the_port():
    page = (ROOT / "docs" / "ray_train_port.md").read_text()
    shown = re.search(r"```diff\n(.*?)```", page, re.S).group(1)
    real = "".join(difflib.unified_diff(
        (ROOT / ORIGINAL).read_text().splitlines(True), (ROOT / PORT).read_text().splitlines(True),
        fromfile=ORIGINAL, tofile=PORT))
    assert shown == real, "regenerate the diff in docs/ray_train_port.md:\n" + real


def test_the_driver_changes_only_in_the_trainer_class():
    """Outside the train loop, the port's lines are the original's but for the trainer."""
    def driver(path: str) -> list[str]:
        text = (ROOT / path).read_text()
        return text[text.index("def main("):].splitlines()

    changed = [(a, b) for a, b in zip(driver(ORIGINAL), driver(PORT), strict=True) if a != b]
    assert changed == [
        ("def main(argv: list[str] | None = None) -> ray.train.Result:",
         "def main(argv: list[str] | None = None) -> rr.Result:"),
        ("    trainer = TorchTrainer(", "    trainer = rr.ResilientTrainer("),
    ]
