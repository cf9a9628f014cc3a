"""The commit protocol on storage: the manifest (commit marker, written last and atomically),
discovery in timeline order, retention and cleanup. Pure functions over `CheckpointStorage`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from ray_resilience._internal.checkpoint.format import checksum, layout
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
            "files": {n: {"size": d.size, d.checksum: d.value}
                      for n, d in sorted(self.files.items())},
        }, indent=1).encode()

    @classmethod
    def parse(cls, data: bytes | memoryview, step_dir: layout.StepDir, *, path: str) -> Manifest:
        """Validates every field; names must be plain checkpoint file names."""
        try:
            raw = json.loads(bytes(data).decode())
            if raw["format"] not in layout.READABLE_FORMATS:
                raise ValueError(f"unknown format {raw['format']!r} (this version reads "
                                 f"{', '.join(layout.READABLE_FORMATS)}: written by a newer "
                                 "ray_resilience?)")
            if (raw["step"], raw["session"]) != (step_dir.step, step_dir.session):
                raise ValueError(f"describes step {raw['step']} session {raw['session']}, "
                                 f"not its folder {step_dir.name}")
            files = {layout.check_file_name(name, where=path): _digest(d)
                     for name, d in raw["files"].items()}
            world_size = int(raw["world_size"])
            if world_size < 1 or layout.METADATA_NAME not in files:
                raise ValueError("world_size < 1 or no .metadata listed")
            return cls(step_dir, world_size, files, float(raw["committed_at"]))
        except CheckpointCorruptError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointCorruptError(path, f"malformed commit manifest ({exc})") from exc


def _digest(entry: dict[str, Any]) -> FileDigest:
    """A manifest's file entry: its size and one checksum this version can compute."""
    for name, value in entry.items():
        if name != "size" and checksum.known_checksum(name):
            return FileDigest(int(entry["size"]), int(value), name)
    raise ValueError(f"no checksum this version can verify in {sorted(entry)} (CRC-32C needs "
                     "the crc32c package)")


def commit_step(storage: CheckpointStorage, step_dir: layout.StepDir, *, world_size: int,
                metadata: bytes, files: dict[str, FileDigest],
                fence: Callable[[], None] | None = None) -> Manifest:
    """Writes `.metadata`, then the manifest that commits the step (both atomic). `fence()` runs
    right before the manifest: it raises when this job may no longer commit (the run's lease)."""
    storage.write_atomic(f"{step_dir.name}/{layout.METADATA_NAME}", metadata)
    all_files = dict(files)
    all_files[layout.METADATA_NAME] = FileDigest(
        len(metadata), checksum.checksum(checksum.CHECKSUM, metadata), checksum.CHECKSUM)
    manifest = Manifest(step_dir, world_size, all_files, time.time())
    if fence is not None:
        fence()
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


def committed_steps(storage: CheckpointStorage, *,
                    generation: int | None = None) -> list[layout.StepDir]:
    """Committed step folders, newest first on the run's timeline (`layout.timeline_key`): after
    a rollback, the resumed attempt's commits come before the abandoned ones, whatever their step.
    """
    found = [d for d in storage.list_step_dirs()
             if storage.exists(f"{d.name}/{layout.MANIFEST_NAME}")]
    return sorted(found, key=lambda d: layout.timeline_key(d, generation), reverse=True)


def delete_step(storage: CheckpointStorage, step_dir: layout.StepDir) -> None:
    """Removes a step folder; the manifest goes first so the step stops counting at once."""
    storage.delete_file(f"{step_dir.name}/{layout.MANIFEST_NAME}")
    storage.delete_dir(step_dir.name)


def prune(storage: CheckpointStorage, *, num_to_keep: int, generation: int,
          session: str | None, quarantined: Collection[layout.StepDir] = ()
          ) -> list[layout.StepDir]:
    """Deletes what can no longer be loaded or committed, never a folder of a newer generation
    than this job's (`generation`: its lease). Kept: the newest `num_to_keep` committed steps on
    the timeline that are not `quarantined` (quarantined ones newer than the last of those too);
    `session`'s folders above its newest commit (in flight); with `session` None (unknown, the
    coordinator just restarted), every folder of this generation."""
    committed = committed_steps(storage, generation=generation)
    doomed, kept = [], 0
    for step_dir in committed:
        if kept >= num_to_keep:
            doomed.append(step_dir)
        elif step_dir not in quarantined:
            kept += 1
    newest_own = next((d for d in committed if d.session == session), None)
    committed_set = set(committed)
    doomed += [d for d in storage.list_step_dirs() if d not in committed_set
               and not _may_still_commit(d, generation, session, newest_own)]
    doomed = [d for d in doomed if layout.session_generation(d.session) <= generation]
    for step_dir in doomed:
        delete_step(storage, step_dir)
    if doomed:
        logger.info("checkpoint cleanup under %s removed %s", storage.display(),
                    [d.name for d in doomed])
    return doomed


def _may_still_commit(step_dir: layout.StepDir, generation: int, session: str | None,
                      newest_own: layout.StepDir | None) -> bool:
    """Whether an uncommitted folder may still be committed (or belongs to a newer job)."""
    folder_generation = layout.session_generation(step_dir.session)
    if folder_generation != generation:
        return folder_generation > generation
    if session is None:
        return True
    if step_dir.session != session:  # a later session than the current one: never ours to end
        return layout.session_order(step_dir.session) > layout.session_order(session)
    return newest_own is None or step_dir.step > newest_own.step
