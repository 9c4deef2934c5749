"""The GRPO job end to end on CPU: Ray actors -> pool -> TRL trainer (both modes) -> weights back."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("ray")
pytest.importorskip("trl")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["streaming", "sync"])
def test_two_grpo_steps_through_ray_actors(tmp_path, policy_dir, prompts_file, mode) -> None:
    from trainers.config import load_config
    from trainers.job import run_job

    config = load_config(
        None,
        [
            f"output_dir={tmp_path / 'run'}",
            f"model={policy_dir}",
            f"dataset.source={prompts_file}",
            f"trainer.mode={mode}",
            "trainer.max_steps=2",
            "trainer.num_generations=2",
            "trainer.prompts_per_step=2",
            "trainer.max_completion_length=8",
            "rollout.engine={max_model_len: 64, max_num_seqs: 16, num_kv_blocks: 64, block_size: 8}",
        ],
    )
    summary = run_job(config)
    assert summary["steps"] == 2
    assert summary["sequences"] >= 2 * 2 * 2
    assert summary["rollout_tokens_per_s"] > 0
    assert summary["weight_syncs"] >= 1, "trained weights went back to the actors"
    parity = [d for d in summary["logprob_max_abs_diff"] if d is not None]
    assert parity and max(parity) < 1e-4, "actor logprobs match the trainer's forward after sync"
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    for key in (
        "steps",
        "sequences",
        "rollout_tokens_per_s",
        "reward_mean_first",
        "reward_mean_last",
        "wandb_dir",
    ):
        assert key in written
    assert (tmp_path / "run" / "wandb").exists(), "W&B wrote its offline run under the output dir"
