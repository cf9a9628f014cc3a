"""The user's error, always: every failure before the first step ends the run with a typed error
naming the cause (module, rank, node, fix), never with an internal error of the supervisor."""

from __future__ import annotations

import sys
import threading

import pytest
import ray

import ray_resilience as rr
from ray_resilience._internal.attempt import AttemptOutcome, AttemptSpec
from ray_resilience._internal.rank.actor import WorkerActor
from ray_resilience._internal.worker_group.rank_calls import RankCalls
from ray_resilience.errors import (
    ConfigError,
    RestartLimitError,
    TrainingFailedError,
    WorkerError,
    WorkerStartupError,
)

RUNGS_WITHOUT_CHECKPOINTS = {"checkpoint": None}
"""Every restart rung on (nothing is retried here anyway), no writer actors to start."""


def _trainer(fn, tmp_path, name: str) -> rr.ResilientTrainer:
    return rr.ResilientTrainer(
        fn, scaling_config=rr.ScalingConfig(num_workers=2),
        run_config=rr.RunConfig(name=name, storage_path=str(tmp_path), verbose=False),
        resilience=rr.ResilienceConfig.default(**RUNGS_WITHOUT_CHECKPOINTS))


@pytest.fixture
def unshipped_module(tmp_path):
    """A module the driver imports from a folder the ranks do not have (code not shipped)."""
    folder = tmp_path / "user_code"
    folder.mkdir()
    (folder / "my_train_code.py").write_text(
        "import ray_resilience as rr\n\n"
        "def train_loop(config):\n    rr.report({'loss': 1.0}, step=1)\n")
    sys.path.insert(0, str(folder))
    try:
        import my_train_code  # noqa: PLC0415 - importable only once the folder is on the path

        yield my_train_code
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("my_train_code", None)


@pytest.mark.timeout(180)
def test_a_train_function_the_ranks_cannot_import_names_module_rank_node_and_fix(
        ray_session, tmp_path, unshipped_module):
    trainer = _trainer(unshipped_module.train_loop, tmp_path / "store", "unshipped")
    with pytest.raises(TrainingFailedError) as failed:
        trainer.fit()
    err = failed.value.error
    assert isinstance(err, WorkerStartupError), repr(err)
    assert err.rank == 0 and err.exc_type == "ModuleNotFoundError"
    assert "No module named 'my_train_code'" in err.message
    assert ray.util.get_node_ip_address() in err.node
    assert "working_dir" in err.fix and "'my_train_code'" in err.fix
    result = failed.value.result
    assert result.attempts == 1 and result.faults == []  # ended at start: nothing retried
    assert "my_train_code" in str(failed.value)


def test_an_unpicklable_train_function_is_refused_before_any_actor_starts():
    lock = threading.Lock()

    def train_loop(config):
        with lock:
            rr.report({"loss": 1.0}, step=1)

    with pytest.raises(ConfigError) as info:
        rr.ResilientTrainer(train_loop)
    assert info.value.field == "train_loop_per_worker[closure 'lock']"
    assert "cannot pickle '_thread.lock'" in str(info.value)


@pytest.mark.timeout(180)
def test_an_exception_in_setup_before_the_first_step_is_the_users_error(ray_session, tmp_path):
    def setup_fails(config):
        raise FileNotFoundError("tokenizer.json not found in /data/llama")

    with pytest.raises(TrainingFailedError) as failed:
        _trainer(setup_fails, tmp_path, "setup").fit()
    err = failed.value.error
    assert isinstance(err, RestartLimitError)  # the in-process rung retried: no progress
    assert err.setting == "InProcessConfig.max_attempts_without_progress"
    assert isinstance(err.last_error, WorkerError)
    assert err.last_error.exc_type == "FileNotFoundError"
    assert "tokenizer.json" in str(failed.value)


@ray.remote(num_cpus=0)
class _Supervisor:
    """What a rank calls on its supervisor during an attempt."""

    def heartbeat(self, *args, **kwargs) -> None:
        return None


@pytest.mark.timeout(180)
def test_a_failing_attempt_setup_is_that_ranks_failed_outcome(ray_session):
    """`run_attempt` raising before the train function (here: a checkpoint spec it cannot use)
    returns a failed outcome, as an exception in the train function does."""
    actor = ray.remote(WorkerActor).options(num_cpus=0).remote(
        ray.cloudpickle.dumps(lambda: None), None, _Supervisor.remote())
    spec = AttemptSpec(attempt=0, rank=0, world_size=1, local_rank=0, local_world_size=1,
                       node_rank=0, master_addr="127.0.0.1", master_port=1, backend="gloo",
                       use_gpu=False, run_name="setup", run_dir="/tmp/setup",
                       process_group_timeout_s=60.0, rendezvous_timeout_s=5.0,
                       progress_interval_s=0.25, checkpoint_spec=object())
    try:
        outcome = ray.get(actor.run_attempt.remote(spec), timeout=120)
    finally:
        ray.kill(actor)
    assert isinstance(outcome, AttemptOutcome) and outcome.status == "failed"
    assert outcome.error.exc_type == "AttributeError" and outcome.error.ranks == [0]


@ray.remote(num_cpus=0)
def _raises() -> None:
    raise OSError("disk vanished")


@ray.remote(num_cpus=0)
def _returns_a_class_only_the_rank_has(folder: str) -> object:
    import pathlib  # noqa: PLC0415 - runs in a Ray worker

    (pathlib.Path(folder) / "rank_only_mod.py").write_text("class Outcome:\n    pass\n")
    sys.path.insert(0, folder)
    import rank_only_mod  # noqa: PLC0415 - exists only in this worker's path

    return rank_only_mod.Outcome()


@pytest.mark.timeout(120)
def test_a_run_call_that_raised_or_does_not_unpickle_is_a_rank_fault(ray_session, tmp_path):
    """Review L12: the supervisor reads these as the rank's failure, not as its own crash."""
    calls = RankCalls()
    calls.attempt = 3
    raised = calls.outcome(_raises.remote(), 1)
    assert isinstance(raised, AttemptOutcome) and raised.status == "failed"
    assert raised.error.exc_type == "OSError" and "disk vanished" in raised.error.message
    assert (raised.rank, raised.attempt, raised.error.ranks) == (1, 3, [1])
    garbled = calls.outcome(_returns_a_class_only_the_rank_has.remote(str(tmp_path)), 0)
    assert isinstance(garbled, AttemptOutcome) and garbled.status == "failed"
    assert "rank_only_mod" in garbled.error.message
