"""Where a run's lease lives and how it is swapped atomically.

POSIX/FSx: one file per generation, `lease-<generation>.json`; the newest is current. A new
generation is created with `link(2)` of a complete temporary file (fails if it exists, like
`O_EXCL`, and no reader ever sees a partial file); a renewal rewrites the holder's own file by
rename once it checked that its generation is still the newest. S3: one object, created with
`If-None-Match: *` and swapped with `If-Match: <etag>` (boto3; pyarrow has no conditional put),
credentials from the standard AWS chain of the calling process.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow.fs as pafs

from ray_resilience._internal.checkpoint.format.lease import (
    LeaseBackend,
    LeaseConflict,
    LeaseRecord,
)
from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage
from ray_resilience.checkpoint.errors import CheckpointCorruptError, CheckpointError, classify

S3_LEASE_NAME = "lease.json"
_POSIX_LEASE = re.compile(r"lease-(\d{1,9})\.json")
_CONFLICT_CODES = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")


def lease_backend(storage: CheckpointStorage) -> LeaseBackend | None:
    """The lease of `storage`'s run, in the run folder (beside `checkpoints/`); None for a file
    system with neither POSIX links nor S3 conditional writes (the run then has no lease)."""
    run_folder = posixpath.dirname(storage.root)
    if storage.is_local:
        return PosixLeaseBackend(run_folder)
    if isinstance(storage.fs, pafs.S3FileSystem):
        bucket, _, prefix = run_folder.partition("/")
        options = storage.fs.__reduce__()[1][0]
        where = f"{posixpath.dirname(storage.display())}/{S3_LEASE_NAME}"
        return S3LeaseBackend(bucket, posixpath.join(prefix, S3_LEASE_NAME), where,
                              _client_options(options))
    return None


class PosixLeaseBackend:
    """`lease-<generation>.json` files in the run folder."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.where = os.path.join(folder, "lease-<generation>.json")

    def _path(self, generation: int) -> str:
        return os.path.join(self.folder, f"lease-{generation}.json")

    def _newest(self) -> int | None:
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return None
        generations = [int(m.group(1)) for m in map(_POSIX_LEASE.fullmatch, names) if m]
        return max(generations, default=None)

    def read(self) -> tuple[LeaseRecord, int] | None:
        with _errors(self.where, "read"):
            generation = self._newest()
            if generation is None:
                return None
            path = self._path(generation)
            with open(path, "rb") as f:
                record = LeaseRecord.parse(f.read(), where=path)
        if record.generation != generation:
            raise CheckpointCorruptError(path, f"it holds generation {record.generation}")
        return record, generation

    def create(self, record: LeaseRecord, after: int | None) -> int:
        if record.generation != (after or 0) + 1:
            raise ValueError(f"generation {record.generation} cannot follow {after}")
        with _errors(self.where, "create"):
            os.makedirs(self.folder, exist_ok=True)
            tmp = self._write_temp(record)
            try:
                os.link(tmp, self._path(record.generation))
            except FileExistsError:
                raise LeaseConflict(self._path(record.generation)) from None
            finally:
                os.unlink(tmp)
            _fsync_dir(self.folder)
            if self._newest() != record.generation:  # overtaken twice since our read
                os.unlink(self._path(record.generation))
                raise LeaseConflict(f"generation {self._newest()} exists")
            for old in range(max(record.generation - 8, 1), record.generation - 1):
                try:  # the previous generation stays, for whoever asks who held the run
                    os.unlink(self._path(old))
                except FileNotFoundError:
                    pass
        return record.generation

    def update(self, record: LeaseRecord, version: int) -> int:
        with _errors(self.where, "renew"):
            if record.generation != version or self._newest() != version:
                raise LeaseConflict(f"generation {version} is no longer the newest")
            tmp = self._write_temp(record)
            os.replace(tmp, self._path(version))
            _fsync_dir(self.folder)
        return version

    def _write_temp(self, record: LeaseRecord) -> str:
        tmp = os.path.join(self.folder, f".lease-{uuid.uuid4().hex}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, record.to_bytes())
            os.fsync(fd)
        finally:
            os.close(fd)
        return tmp


class S3LeaseBackend:
    """One object swapped with S3 conditional writes."""

    def __init__(self, bucket: str, key: str, where: str, client_options: dict[str, Any]) -> None:
        self.bucket, self.key, self.where = bucket, key, where
        self._options = client_options
        self._client: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}  # a client is per process

    def _s3(self) -> Any:
        if self._client is None:
            key = repr(sorted(self._options.items()))
            with _CLIENTS_LOCK:
                if key not in _CLIENTS:
                    _CLIENTS[key] = _new_client(self._options)
                self._client = _CLIENTS[key]
        return self._client

    def read(self) -> tuple[LeaseRecord, str] | None:
        with _errors(self.where, "read"):
            try:
                got = self._s3().get_object(Bucket=self.bucket, Key=self.key)
            except Exception as exc:
                if _code(exc) in ("NoSuchKey", "404"):
                    return None
                raise
            return LeaseRecord.parse(got["Body"].read(), where=self.where), got["ETag"]

    def create(self, record: LeaseRecord, after: str | None) -> str:
        condition = {"IfNoneMatch": "*"} if after is None else {"IfMatch": after}
        return self._put(record, condition, "create")

    def update(self, record: LeaseRecord, version: str) -> str:
        return self._put(record, {"IfMatch": version}, "renew")

    def _put(self, record: LeaseRecord, condition: dict[str, str], operation: str) -> str:
        with _errors(self.where, operation):
            try:
                put = self._s3().put_object(Bucket=self.bucket, Key=self.key,
                                            Body=record.to_bytes(), **condition)
            except Exception as exc:
                if _code(exc) in _CONFLICT_CODES:
                    raise LeaseConflict(f"{self.where}: {exc}") from None
                raise
            return put["ETag"]


_CLIENTS: dict[str, Any] = {}
"""boto3 clients of this process by options (thread-safe; a fence arrives with every commit)."""
_CLIENTS_LOCK = threading.Lock()


def _new_client(options: dict[str, Any]) -> Any:
    import boto3  # noqa: PLC0415 - only runs on S3 import it
    from botocore.config import Config  # noqa: PLC0415 - see above

    config = Config(connect_timeout=5, read_timeout=15,
                    retries={"max_attempts": 3, "mode": "standard"})
    return boto3.client("s3", config=config, **options)


def _client_options(fs_options: dict[str, Any]) -> dict[str, Any]:
    """boto3 client arguments for the S3 file system's endpoint; keys only when the file system
    was given them explicitly (otherwise boto3's standard credential chain, in this process)."""
    options: dict[str, Any] = {}
    if fs_options.get("endpoint_override"):
        options["endpoint_url"] = f"{fs_options.get('scheme') or 'https'}://" \
                                  f"{fs_options['endpoint_override']}"
    if fs_options.get("region"):
        options["region_name"] = fs_options["region"]
    if fs_options.get("access_key"):
        options.update(aws_access_key_id=fs_options["access_key"],
                       aws_secret_access_key=fs_options.get("secret_key"),
                       aws_session_token=fs_options.get("session_token") or None)
    return options


def _code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None) or {}
    error = response.get("Error", {})
    return error.get("Code") or str(response.get("ResponseMetadata", {}).get("HTTPStatusCode"))


@contextlib.contextmanager
def _errors(where: str, operation: str) -> Iterator[None]:
    """Storage failures as typed `CheckpointStorageError`s naming the lease."""
    try:
        yield
    except (LeaseConflict, CheckpointError, ValueError):
        raise
    except Exception as exc:  # OSError, botocore errors: classified by their text
        raise classify(exc, where, f"{operation} the run lease") from exc


def _fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
