"""Checkpoint errors: each names the path, what went wrong and what to change."""

from __future__ import annotations

import errno

from ray_resilience.errors import ResilienceError


class CheckpointError(ResilienceError):
    """Base class of checkpoint errors."""


class CheckpointStorageError(CheckpointError):
    """A storage operation failed. `retryable` is False when retrying cannot help."""

    retryable = True
    hint = ("the storage may be briefly unavailable (S3 endpoint down, network); the write is "
            "retried per CheckpointConfig.num_storage_retries")

    def __init__(self, path: str, operation: str, detail: str) -> None:
        self.path, self.operation, self.detail = path, operation, detail
        super().__init__(f"checkpoint storage: cannot {operation} {path!r}: {detail}. "
                         f"Likely cause: {self.hint}.")

    def __reduce__(self):
        return (type(self), (self.path, self.operation, self.detail))


class StorageUnavailableError(CheckpointStorageError):
    """The storage did not answer or failed transiently."""


class StoragePermissionError(CheckpointStorageError):
    """Permission denied (POSIX EACCES/EPERM/EROFS or S3 AccessDenied)."""

    retryable = False
    hint = ("the process may not write there: fix the directory permissions or the bucket "
            "policy/credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE), or point storage_path elsewhere")


class StorageFullError(CheckpointStorageError):
    """The file system or quota is full."""

    retryable = False
    hint = ("the disk or quota is full: free space, lower CheckpointConfig.num_to_keep, or point "
            "storage_path at a larger volume; the previous committed checkpoint is untouched")


class CheckpointCorruptError(CheckpointError):
    """A checkpoint file is missing, truncated, fails its checksum, or is not safe to read."""

    def __init__(self, path: str, detail: str) -> None:
        self.path, self.detail = path, detail
        super().__init__(f"checkpoint file {path!r} is unusable: {detail}")

    def __reduce__(self):
        return (type(self), (self.path, self.detail))


class UnsafeCheckpointError(CheckpointCorruptError):
    """Storage content tried to escape the run folder or to unpickle a forbidden object."""


class CheckpointLoadError(CheckpointError):
    """Committed checkpoints exist but none could be loaded on every rank."""

    def __init__(self, run_dir: str, failures: list[str]) -> None:
        self.run_dir, self.failures = run_dir, list(failures)
        listing = "; ".join(self.failures) or "none"
        super().__init__(
            f"no committed checkpoint under {run_dir!r} could be loaded on every rank (tried, "
            f"newest first: {listing}). Restore the files from a backup, or start a new run name "
            "to train from scratch.")

    def __reduce__(self):
        return (type(self), (self.run_dir, self.failures))


class CheckpointStateError(CheckpointError, TypeError):
    """The state handed to save cannot be stored safely (e.g. an `extra` value of a bad type, or
    a state item that would save but never load)."""

    def __init__(self, key: str, detail: str, where: str = "extra") -> None:
        self.key, self.detail, self.where = key, detail, where
        super().__init__(f"checkpoint {where}[{key!r}]: {detail}")

    def __reduce__(self):
        return (type(self), (self.key, self.detail, self.where))


class RunInUseError(CheckpointError):
    """Another job holds the run's lease: two jobs never write one run's checkpoints."""

    def __init__(self, run: str, holder: str, where: str, wait_s: float) -> None:
        self.run, self.holder, self.where, self.wait_s = run, holder, where, wait_s
        waited = f" (waited {wait_s:.0f} s)" if wait_s else ""
        super().__init__(
            f"run {run!r} is in use{waited}: its checkpoints ({where}) are held by {holder}. Wait "
            "for that job to end, give this one another RunConfig.name, or set "
            "CheckpointConfig.lease_wait_s to wait for it (a crashed holder's lease expires).")

    def __reduce__(self):
        return (type(self), (self.run, self.holder, self.where, self.wait_s))


class LeaseLostError(CheckpointError):
    """This job may no longer commit or delete the run's checkpoints: another job took the run
    over (`final`), or the lease could not be confirmed in time (it may come back)."""

    def __init__(self, run: str, where: str, detail: str, final: bool = True) -> None:
        self.run, self.where, self.detail, self.final = run, where, detail, final
        super().__init__(f"run {run!r}: this job no longer holds the lease {where}: {detail}. "
                         "It commits and deletes no checkpoint of the run from now on.")

    def __reduce__(self):
        return (type(self), (self.run, self.where, self.detail, self.final))


_PERMISSION_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS}
_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_PERMISSION_WORDS = ("AccessDenied", "ACCESS_DENIED", "Forbidden", "InvalidAccessKeyId",
                     "SignatureDoesNotMatch", "Permission denied", "Read-only file system")
_FULL_WORDS = ("No space left", "Disk quota exceeded", "QuotaExceeded")


def classify(exc: BaseException, path: str, operation: str) -> CheckpointStorageError:
    """Maps a pyarrow/OS error to the typed storage error that says what to do."""
    if isinstance(exc, CheckpointStorageError):
        return exc
    text = f"{type(exc).__name__}: {exc}"
    code = getattr(exc, "errno", None)
    if code in _PERMISSION_ERRNOS or any(w in text for w in _PERMISSION_WORDS):
        return StoragePermissionError(path, operation, text)
    if code in _FULL_ERRNOS or any(w in text for w in _FULL_WORDS):
        return StorageFullError(path, operation, text)
    return StorageUnavailableError(path, operation, text)
