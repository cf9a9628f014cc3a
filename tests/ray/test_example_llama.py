"""The example job's workload: transformers' LlamaForCausalLM (a small config of the Llama 3
family), FSDP2 per decoder layer, meta-device init, activation checkpointing and tokenized
Parquet through Ray Data. A run with an exception and a SIGKILL ends with a final checkpoint
(weights and optimizer state) bit-equal to the fault-free run's.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from ray_resilience.examples import train_llama
from ray_resilience.examples.job_args import parse_args
from ray_resilience.testing import Fault, FaultPlan
from tests.support.checkpoint_service import step_folder

STEPS = 8


def _fit(data: str, storage: str, name: str, plan: FaultPlan | None = None):
    args = parse_args([
        "--model", "llama3-tiny", "--num_workers", "2", "--max_steps", str(STEPS),
        "--train_batch_size", "2", "--checkpoint_freq", "4", "--grad_clip", "1.0",
        "--activation_checkpointing", "1", "--data", data, "--checkpoint_dir", storage,
        "--run_name", name, "--quiet"])
    return train_llama.build_trainer(args, fault_plan=plan).fit()


def _final_state(storage: str, name: str, tmp_path) -> dict[str, torch.Tensor]:
    """The run's last committed checkpoint, read with torch's own DCP converter."""
    out = tmp_path / f"{name}.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_to_torch_save(step_folder(storage, name, STEPS), out)
    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), item)
        elif isinstance(value, torch.Tensor):
            flat[prefix] = value

    walk("", torch.load(out, weights_only=True))  # plain tensors and containers
    return flat


@pytest.mark.slow  # ~2 min: two HF Llama runs
@pytest.mark.timeout(900)
def test_hf_llama_fsdp2_survives_an_exception_and_a_sigkill_bit_equal(ray_session,
                                                                      token_data_dir, tmp_path):
    clean = _fit(token_data_dir, str(tmp_path / "clean"), "hf-clean")
    assert clean.ok, clean.error
    assert {r["model"] for r in clean.return_values} == {"FSDPLlamaForCausalLM"}
    plan = FaultPlan.explicit([Fault(step=3, rank=1, kind="exception"),
                               Fault(step=6, rank=0, kind="sigkill")])
    faulty = _fit(token_data_dir, str(tmp_path / "faulty"), "hf-faults", plan)
    assert faulty.ok, faulty.error
    assert [f["cause"] for f in faulty.faults] == ["exception", "actor_died"]
    expected = _final_state(str(tmp_path / "clean"), "hf-clean", tmp_path)
    got = _final_state(str(tmp_path / "faulty"), "hf-faults", tmp_path)
    assert any(k.endswith("self_attn.q_proj.weight") for k in expected)  # transformers' names
    assert any(".exp_avg_sq" in k or "exp_avg_sq" in k for k in expected)  # optimizer state too
    assert expected.keys() == got.keys()
    differ = [k for k in expected if not torch.equal(expected[k], got[k])]
    assert not differ, f"differs from the fault-free run: {differ[:5]}"
    losses = {m["step"]: m["loss"] for m in clean.metrics_history if m["rank"] == 0}
    assert losses[STEPS] < losses[1]
