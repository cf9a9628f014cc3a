"""`DirectFile`: checkpoint data files written with O_DIRECT round-trip byte for byte at every
size and chunking, stay out of the page cache, and fall back to buffered writes where the file
system refuses O_DIRECT (at open: tmpfs; at the first write: some FUSE and NFS mounts)."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from ray_resilience._internal.checkpoint.format.direct import files as direct_file
from ray_resilience._internal.checkpoint.format.direct.files import BLOCK, BUFFER_BYTES, DirectFile
from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage
from ray_resilience.checkpoint import CheckpointConfig
from ray_resilience.errors import ConfigError
from tests.support.page_cache import resident_fraction

pytestmark = pytest.mark.timeout(60)


def _data(nbytes: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8).tobytes()


def _write(path: str, data: bytes, chunk: int) -> DirectFile:
    with DirectFile(path) as out:
        for start in range(0, len(data), chunk):
            assert out.write(data[start:start + chunk]) == len(data[start:start + chunk])
            assert out.tell() == min(start + chunk, len(data))
    return out


def _direct_here(folder) -> bool:
    try:
        fd = os.open(os.path.join(folder, ".probe"), os.O_WRONLY | os.O_CREAT | os.O_DIRECT)
    except OSError:
        return False
    os.close(fd)
    os.unlink(os.path.join(folder, ".probe"))
    return True


@pytest.mark.parametrize("nbytes", [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, BUFFER_BYTES,
                                    BUFFER_BYTES + 1, 2 * BUFFER_BYTES + 12345])
@pytest.mark.parametrize("chunk", [7, 4096 * 3 + 5, 3 * BUFFER_BYTES])
def test_every_size_and_chunking_round_trips(tmp_path, nbytes, chunk):
    if chunk == 7 and nbytes > BLOCK + 1:
        chunk = 64 * 1024 + 7  # byte-sized writes of MBs would only slow the test down
    data = _data(nbytes)
    path = str(tmp_path / "__0_0.distcp")
    _write(path, data, chunk)
    assert os.path.getsize(path) == nbytes
    with open(path, "rb") as f:
        assert f.read() == data


def test_a_direct_file_never_enters_the_page_cache(tmp_path):
    if not _direct_here(tmp_path):
        pytest.skip(f"{tmp_path}'s file system refuses O_DIRECT")
    data = _data(BUFFER_BYTES * 2 + 999)
    path = str(tmp_path / "f.bin")
    out = _write(path, data, 1 << 20)
    assert out.direct
    assert resident_fraction(path) < 0.1
    with open(path, "rb") as f:
        assert f.read() == data


def test_a_refusal_at_open_writes_buffered(tmp_path, monkeypatch):
    real = os.open

    def refusing(path, flags, *args):
        if flags & os.O_DIRECT:  # what tmpfs before Linux 6.6 answers
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(path, flags, *args)

    monkeypatch.setattr(direct_file.os, "open", refusing)
    data = _data(BUFFER_BYTES + 5)
    path = str(tmp_path / "f.bin")
    out = _write(path, data, 1 << 20)
    assert not out.direct
    with open(path, "rb") as f:
        assert f.read() == data


def test_a_refusal_at_the_first_write_switches_to_buffered(tmp_path, monkeypatch):
    real, refused = os.pwrite, []

    def refusing(fd, data, offset):
        import fcntl  # noqa: PLC0415 - only this fake

        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data, offset)

    monkeypatch.setattr(direct_file.os, "pwrite", refusing)
    data = _data(BUFFER_BYTES * 2 + 77)
    path = str(tmp_path / "f.bin")
    out = _write(path, data, 1 << 20)
    if not refused:
        pytest.skip(f"{tmp_path}'s file system refuses O_DIRECT at open")
    assert not out.direct and refused == [0]
    with open(path, "rb") as f:
        assert f.read() == data


def test_other_write_errors_propagate_and_close_the_file(tmp_path, monkeypatch):
    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(direct_file.os, "pwrite", full)
    out = DirectFile(str(tmp_path / "f.bin"))
    with pytest.raises(OSError, match="No space"), out:
        out.write(_data(BUFFER_BYTES + 1))
    assert out._fd == -1


@pytest.mark.parametrize("direct", [True, False])
def test_storage_open_output_writes_the_same_bytes_direct_or_not(tmp_path, direct):
    storage = CheckpointStorage.for_run(str(tmp_path), "run")
    storage.make_dir("step")
    data = _data(3 * BLOCK + 10)
    with storage.open_output("step/__0_0.distcp", direct=direct) as out:
        out.write(data[:100])
        out.write(data[100:])
    with open(storage.path("step/__0_0.distcp"), "rb") as f:
        assert f.read() == data


def test_direct_io_must_be_a_bool():
    with pytest.raises(ConfigError, match="direct_io"):
        CheckpointConfig(direct_io="yes")
