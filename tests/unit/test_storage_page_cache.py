"""A checkpoint file written to a local filesystem leaves the page cache once it is on its device
(`CheckpointStorage.open_output`): saves reuse the memory the last one's files freed instead of
taking more from training. Residency is read with mincore(2)."""

from __future__ import annotations

import os

import pytest

from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage
from tests.support.page_cache import resident_fraction

pytestmark = pytest.mark.timeout(60)
NBYTES = 8 << 20
def test_a_written_checkpoint_file_leaves_the_page_cache(tmp_path):
    data = os.urandom(NBYTES)
    kept = tmp_path / "plain.bin"
    with open(kept, "wb") as f:  # the control: a plain write stays cached
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    if resident_fraction(str(kept)) < 0.9:
        pytest.skip(f"{tmp_path}'s filesystem does not keep written pages cached")
    storage = CheckpointStorage.for_run(str(tmp_path), "run")
    storage.make_dir("step")
    with storage.open_output("step/__0_0.distcp") as out:
        out.write(data)
    path = storage.path("step/__0_0.distcp")
    assert resident_fraction(path) < 0.1
    with open(path, "rb") as f:  # and the bytes are all there
        assert f.read() == data
