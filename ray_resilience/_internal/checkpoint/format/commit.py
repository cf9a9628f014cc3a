"""The commit protocol on storage: the manifest (commit marker, written last and atomically),
discovery, retention and cleanup. Pure functions over `CheckpointStorage`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import zlib

from ray_resilience._internal.checkpoint.format import layout
from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage
from ray_resilience._internal.checkpoint.wire import FileDigest
from ray_resilience.checkpoint.errors import CheckpointCorruptError

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A committed step: its folder, world size and the digest of every file in it."""

    step_dir: layout.StepDir
    world_size: int
    files: dict[str, FileDigest]
    committed_at: float

    def to_bytes(self) -> bytes:
        return json.dumps({
            "format": layout.FORMAT_VERSION, "step": self.step_dir.step,
            "session": self.step_dir.session, "world_size": self.world_size,
            "committed_at": self.committed_at,
            "files": {n: {"size": d.size, "crc32": d.crc32} for n, d in sorted(self.files.items())},
        }, indent=1).encode()

    @classmethod
    def parse(cls, data: bytes | memoryview, step_dir: layout.StepDir, *, path: str) -> Manifest:
        """Validates every field; names must be plain checkpoint file names."""
        try:
            raw = json.loads(bytes(data).decode())
            if raw["format"] != layout.FORMAT_VERSION:
                raise ValueError(f"unknown format {raw['format']!r}")
            if (raw["step"], raw["session"]) != (step_dir.step, step_dir.session):
                raise ValueError(f"describes step {raw['step']} session {raw['session']}, "
                                 f"not its folder {step_dir.name}")
            files = {layout.check_file_name(name, where=path):
                     FileDigest(int(d["size"]), int(d["crc32"]))
                     for name, d in raw["files"].items()}
            world_size = int(raw["world_size"])
            if world_size < 1 or layout.METADATA_NAME not in files:
                raise ValueError("world_size < 1 or no .metadata listed")
            return cls(step_dir, world_size, files, float(raw["committed_at"]))
        except CheckpointCorruptError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointCorruptError(path, f"malformed commit manifest ({exc})") from exc


def commit_step(storage: CheckpointStorage, step_dir: layout.StepDir, *, world_size: int,
                metadata: bytes, files: dict[str, FileDigest]) -> Manifest:
    """Writes `.metadata`, then the manifest that commits the step. Both writes are atomic."""
    storage.write_atomic(f"{step_dir.name}/{layout.METADATA_NAME}", metadata)
    all_files = dict(files)
    all_files[layout.METADATA_NAME] = FileDigest(len(metadata), zlib.crc32(metadata))
    manifest = Manifest(step_dir, world_size, all_files, time.time())
    storage.write_atomic(f"{step_dir.name}/{layout.MANIFEST_NAME}", manifest.to_bytes())
    return manifest


def read_manifest(storage: CheckpointStorage, step_dir: layout.StepDir) -> Manifest | None:
    """The step's manifest, or None when the step is not committed."""
    rel = f"{step_dir.name}/{layout.MANIFEST_NAME}"
    try:
        data = storage.read_bytes(rel)
    except FileNotFoundError:
        return None
    return Manifest.parse(data, step_dir, path=storage.display(rel))


def committed_steps(storage: CheckpointStorage) -> list[layout.StepDir]:
    """Committed step folders, newest first (by step; the later commit of a step first)."""
    found = [d for d in storage.list_step_dirs()
             if storage.exists(f"{d.name}/{layout.MANIFEST_NAME}")]
    steps = [d.step for d in found]
    if len(set(steps)) == len(steps):
        return sorted(found, key=lambda d: d.step, reverse=True)
    # Two attempts committed the same step (a resume from an older checkpoint): newest wins.
    def commit_time(d: layout.StepDir) -> float:
        try:
            manifest = read_manifest(storage, d)
        except CheckpointCorruptError:
            return 0.0
        return manifest.committed_at if manifest else 0.0
    return sorted(found, key=lambda d: (d.step, commit_time(d)), reverse=True)


def delete_step(storage: CheckpointStorage, step_dir: layout.StepDir) -> None:
    """Removes a step folder; the manifest goes first so the step stops counting at once."""
    storage.delete_file(f"{step_dir.name}/{layout.MANIFEST_NAME}")
    storage.delete_dir(step_dir.name)


def prune(storage: CheckpointStorage, *, num_to_keep: int, keep_session: str | None,
          newest_committed: layout.StepDir | None) -> list[layout.StepDir]:
    """Deletes committed steps beyond the newest `num_to_keep` and folders that can no longer
    commit; folders of `keep_session` above its newest commit are in flight and kept."""
    committed = committed_steps(storage)
    doomed = committed[num_to_keep:]
    committed_set = set(committed)
    for step_dir in storage.list_step_dirs():
        if step_dir in committed_set:
            continue
        in_flight = step_dir.session == keep_session and (
            newest_committed is None or step_dir.step > newest_committed.step)
        if not in_flight:
            doomed.append(step_dir)
    for step_dir in doomed:
        delete_step(storage, step_dir)
    if doomed:
        logger.info("checkpoint cleanup under %s removed %s", storage.display(),
                    [d.name for d in doomed])
    return doomed
