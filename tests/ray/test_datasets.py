"""Ray Data: `ResilientTrainer(datasets=...)` and `get_dataset_shard`. Each rank's batches are a
fixed function of the dataset and the world size; the position travels with every checkpoint,
so a run with faults ends bit-equal to the fault-free run (the oracle), also with its data on S3.
"""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest

import ray_resilience as rr
from ray_resilience.cli import main as cli_main
from ray_resilience.errors import ConfigError
from ray_resilience.testing import Fault, FaultPlan
from tests.support import data_workload as dw
from tests.support.workload import assert_bit_equal

STEPS = 14
"""Crosses the first epoch's end (10 global batches) and trains 4 steps of the second."""


def _read(path: str, **kwargs):
    """The test's Parquet folder as one block: one read task (cheap on a 2-core machine)."""
    import ray.data  # noqa: PLC0415 - after the session's Ray is up

    return ray.data.read_parquet(path, override_num_blocks=1, **kwargs)


@pytest.fixture(scope="module")
def parquet_dir(token_data_dir, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("rows"))
    dw.write_dataset(token_data_dir, out)
    return out


@pytest.fixture(scope="module")
def clean(ray_session, parquet_dir, tmp_path_factory):
    result = dw.fit(_read(parquet_dir), str(tmp_path_factory.mktemp("clean")),
                    "data-clean", max_steps=STEPS)
    assert result.ok, result.error
    return result


@pytest.mark.slow  # ~1.5 min; the fault test below covers the same reads
@pytest.mark.timeout(600)
def test_each_rank_reads_its_slice_of_each_global_batch_the_same_way_twice(
        clean, parquet_dir, tmp_path):
    for rank, value in enumerate(clean.return_values):
        assert sorted(value["seen"]) == list(range(1, STEPS + 1))
        for step, (epoch, rows) in value["seen"].items():
            assert rows == dw.expected_rows(step, rank, 2), (rank, step)
            assert epoch == (step - 1) // 10
    again = dw.fit(_read(parquet_dir), str(tmp_path), "data-again",
                   max_steps=STEPS)
    assert again.ok, again.error
    for rank in range(2):
        assert again.return_values[rank]["seen"] == clean.return_values[rank]["seen"]
        assert_bit_equal(again.return_values[rank]["state"], clean.return_values[rank]["state"])


@pytest.mark.slow  # ~70 s with Ray Data's start; tests/ray/test_ray_train_port.py resumes a shard
@pytest.mark.timeout(600)
def test_exception_and_sigkill_mid_epoch_end_bit_equal(clean, parquet_dir, tmp_path):
    plan = FaultPlan.explicit([Fault(step=6, rank=1, kind="exception"),
                               Fault(step=12, rank=0, kind="sigkill")])
    result = dw.fit(_read(parquet_dir), str(tmp_path), "data-faults",
                    max_steps=STEPS, extra={"note": "kept"},
                    resilience=rr.ResilienceConfig.default(checkpoint_interval=4,
                                                           fault_plan=plan))
    assert result.ok, result.error
    assert [f["cause"] for f in result.faults] == ["exception", "actor_died"]
    for rank in range(2):
        value = result.return_values[rank]
        assert value["attempt"] == 2 and value["resumed_from"] is not None
        assert value["extra"] == {"note": "kept"}  # the data position is not the user's
        for step, seen in value["seen"].items():  # the last attempt's steps, as fault-free
            assert seen == clean.return_values[rank]["seen"][step], (rank, step)
        assert_bit_equal(value["state"], clean.return_values[rank]["state"])


@pytest.mark.slow  # ~40 s; S3 reads are covered by tests/ray/test_checkpoint_s3.py
@pytest.mark.timeout(600)
def test_parquet_on_s3_reads_the_same_rows(clean, s3_server, token_data_dir, tmp_path, capsys):
    fs = pafs.S3FileSystem(endpoint_override=s3_server.endpoint, scheme="http",
                           access_key=s3_server.access_key, secret_key=s3_server.secret_key,
                           region="us-east-1")
    dw.write_dataset(token_data_dir, f"{s3_server.bucket}/rows", filesystem=fs)
    dataset = _read(f"s3://{s3_server.bucket}/rows", filesystem=fs)
    storage = s3_server.uri("data-runs")
    result = dw.fit(dataset, storage, "data-s3", max_steps=STEPS)
    assert result.ok, result.error
    for rank in range(2):
        assert result.return_values[rank]["seen"] == clean.return_values[rank]["seen"]
        assert_bit_equal(result.return_values[rank]["state"], clean.return_values[rank]["state"])
    capsys.readouterr()
    assert cli_main(["show", result.path]) == 0  # the run folder read back through pyarrow.fs
    assert '"state": "finished"' in capsys.readouterr().out


@pytest.mark.slow  # ~2.5 min: three runs
@pytest.mark.timeout(600)
def test_a_smaller_world_continues_at_the_next_unread_global_row(ray_session, parquet_dir,
                                                                 tmp_path):
    """Documented: the position is a global row, so after 6 steps of 2 ranks x 4 rows (48 rows)
    the single rank left reads rows 48, 49, ... in batches of 4."""
    resilience = rr.ResilienceConfig.default(checkpoint_interval=2)
    first = dw.fit(_read(parquet_dir), str(tmp_path), "data-shrink",
                   max_steps=6, resilience=resilience)
    assert first.ok, first.error
    second = dw.fit(_read(parquet_dir), str(tmp_path), "data-shrink",
                    num_workers=1, max_steps=12, resilience=resilience)
    assert second.ok, second.error
    (value,) = second.return_values
    assert value["resumed_from"] == 6 and value["world_size"] == 1
    assert value["seen"] == {step: (0, list(range(48 + 4 * (step - 7), 52 + 4 * (step - 7))))
                             for step in range(7, 13)}


def test_datasets_must_be_ray_datasets():
    with pytest.raises(ConfigError, match=r"datasets\['train'\]"):
        rr.ResilientTrainer(lambda: None, datasets={"train": [1, 2, 3]})
    with pytest.raises(ConfigError, match="datasets"):
        rr.ResilientTrainer(lambda: None, datasets=["train"])
