"""The example job's command line: AWS test-case names, model presets, which Ray it joins, and
the manifest validator reading the same names."""

from __future__ import annotations

import pytest

from ray_resilience.deploy.job_rules import JOB_ARG_ALIASES
from ray_resilience.examples import hf_llama
from ray_resilience.examples.job_args import config_overrides, parse_args, parser
from ray_resilience.examples.train_llama import ray_init_kwargs


def test_aws_argument_names_mean_ours():
    ours = parse_args(["--batch_size", "2", "--max_steps", "7", "--checkpoint_interval", "3",
                       "--storage_path", "/fsx/c", "--data", "/fsx/d"])
    aws = parse_args(["--train_batch_size", "2", "--max_training_steps", "7",
                      "--checkpoint_freq", "3", "--checkpoint_dir", "/fsx/c", "--data_dir",
                      "/fsx/d"])
    assert vars(ours) == vars(aws)


def test_the_validators_aliases_are_the_jobs_second_names():
    dests = {opt.lstrip("-"): action.dest for action in parser()._actions
             for opt in action.option_strings}
    for alias, canonical in JOB_ARG_ALIASES.items():
        assert dests[alias] == dests[canonical] == canonical, alias


def test_model_type_shapes_a_llama_from_the_8b_preset():
    args = parse_args(["--model_type", "llama_v3", "--hidden_width", "64", "--num_layers", "2",
                       "--num_heads", "4", "--num_key_value_heads", "2",
                       "--intermediate_size", "172", "--vocab_size", "256", "--bf16", "0"])
    assert args.model == "llama3.1-8b" and args.bf16 is False
    config = hf_llama.llama_config(args.model, **config_overrides(args))
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (64, 2, 256)
    assert config.rope_parameters["rope_type"] == "llama3"


def test_the_8b_preset_is_llama_3_1_8b():
    assert round(hf_llama.num_parameters(hf_llama.llama_config("llama3.1-8b")) / 1e9, 2) == 8.03


@pytest.mark.parametrize("argv", [["--model", "tiny", "--hidden_width", "64"],
                                  ["--model", "tiny", "--model_type", "llama_v3"],
                                  ["--bf16", "yes"]])
def test_contradictory_arguments_are_usage_errors(argv):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2


def test_the_job_joins_ray_address_or_starts_its_own():
    assert ray_init_kwargs("ray://h:10001", {"RAY_ADDRESS": "x:6379"}) == {
        "address": "ray://h:10001"}
    assert ray_init_kwargs(None, {"RAY_ADDRESS": "10.0.0.1:6379"}) == {}
    # Never the address file a dead local cluster may have left behind:
    assert ray_init_kwargs(None, {}) == {"address": "local"}
