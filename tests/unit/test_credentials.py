"""Credentials stay where they are: each process resolves S3 credentials from its own AWS chain,
nothing pickles the environment's keys into what travels to actors, and no key is written into
results."""

from __future__ import annotations

import pickle

import pyarrow.fs as pafs
import pytest

from ray_resilience._internal.checkpoint.format.storage import CheckpointStorage
from ray_resilience._internal.run_folder import run_dir_uri

pytestmark = pytest.mark.timeout(60)
SECRET, TOKEN = "wJalrXUtnFEMI-K7MDENG-secret", "FQoGZXIvYXdzEJr-session-token"
URI = "s3://bucket/runs?endpoint_override=127.0.0.1:9&scheme=http&region=us-east-1"


def test_environment_keys_are_not_pickled_into_the_storage(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    blob = pickle.dumps(CheckpointStorage.for_run(URI, "run"))
    assert SECRET.encode() not in blob and TOKEN.encode() not in blob
    again = pickle.loads(blob)
    assert again.fs.__reduce__()[1][0]["access_key"] in (None, "")  # resolved where unpickled
    assert again.root == "bucket/runs/run/checkpoints"


def test_an_explicit_file_system_keeps_its_own_keys():
    fs = pafs.S3FileSystem(access_key="AKIAEXPLICIT", secret_key=SECRET,
                           endpoint_override="127.0.0.1:9", scheme="http")
    storage = pickle.loads(pickle.dumps(CheckpointStorage.for_run("bucket/runs", "run", fs)))
    assert storage.fs.__reduce__()[1][0]["access_key"] == "AKIAEXPLICIT"


def test_keys_in_the_storage_uri_never_reach_the_run_path():
    path = run_dir_uri(f"s3://bucket/runs?access_key=AKIA&secret_key={SECRET}"
                       f"&session_token={TOKEN}&endpoint_override=host:9000&scheme=http", "run")
    assert path == "s3://bucket/runs/run?endpoint_override=host:9000&scheme=http"
    assert run_dir_uri("s3://bucket/runs", "run") == "s3://bucket/runs/run"
