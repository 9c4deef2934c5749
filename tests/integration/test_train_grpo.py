"""The GRPO job end to end on CPU: Ray actors -> pool -> TRL trainer (both modes) -> weights back."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("ray")
pytest.importorskip("trl")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["streaming", "sync"])
def test_two_grpo_steps_through_ray_actors(tmp_path, policy_dir, prompts_file, mode) -> None:
    from trainers.job import run_job
    from trainers.job.config_loading import load_config

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
            # each mode with a correction (the other jobs run without)
            f"trainer.off_policy_correction={'token_tis' if mode == 'streaming' else 'sequence_mis'}",
        ],
    )
    summary = run_job(config)
    assert summary["steps"] == 2
    mismatch = summary["off_policy"]  # each step's rollout/trainer mismatch, over the run
    assert mismatch is not None and 0 <= mismatch["ratio_mean"] <= mismatch["ratio_max"]
    assert abs(mismatch["kl"]) < 1.0
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
        "dropped_samples",
        "dropped_tokens",
    ):
        assert key in written
    if mode == "streaming":  # what reached the trainer, by the staleness rule
        assert written["staleness_rule"] == "group_last_token"
        assert written["trained_samples"] >= 2 * 2 * 2 and written["trained_mean_length"] > 0
        assert written["generated_mean_length"] > 0 and written["staleness_per_token"] >= 0
    assert (tmp_path / "run" / "wandb").exists(), "W&B wrote its offline run under the output dir"


@pytest.mark.slow
def test_fp8_actors_turn_the_correction_on_and_stay_fp8_after_each_sync(
    tmp_path, policy_dir, prompts_file, capsys
) -> None:
    """Actors with FP8 weights: the job says it turns token_tis on, every sync is rounded again
    (the parity probe sees the FP8 model's gap to the trainer's, not zero), and the run ends."""
    from trainers.job import run_job
    from trainers.job.config_loading import load_config

    config = load_config(
        None,
        [
            f"output_dir={tmp_path / 'run'}",
            f"model={policy_dir}",
            f"dataset.source={prompts_file}",
            "trainer.max_steps=2",
            "trainer.num_generations=2",
            "trainer.prompts_per_step=2",
            "trainer.max_completion_length=8",
            "rollout.engine={max_model_len: 64, max_num_seqs: 16, num_kv_blocks: 64, block_size: 8,"
            " weight_quantization: fp8}",
        ],
    )
    summary = run_job(config)
    assert "trainer.off_policy_correction=token_tis (auto" in capsys.readouterr().out
    assert summary["steps"] == 2 and summary["weight_syncs"] >= 1
    assert summary["off_policy_correction"] == "token_tis"
    assert summary["weight_quantization"] == "fp8"
    parity = [d for d in summary["logprob_max_abs_diff"] if d is not None]
    assert parity and min(parity) > 1e-4, "the actors serve FP8 weights after every sync"
    assert summary["off_policy"]["kl"] != 0.0


@pytest.mark.slow
def test_an_moe_policy_trains_with_speculating_actors(tmp_path, moe_policy_dir, prompts_file):
    """A Qwen3-MoE policy (its 3-D expert weights synced by name like any other) with n-gram
    speculation in the actor: the parity probe holds after every sync."""
    from trainers.job import run_job
    from trainers.job.config_loading import load_config

    config = load_config(
        None,
        [
            f"output_dir={tmp_path / 'run'}",
            f"model={moe_policy_dir}",
            f"dataset.source={prompts_file}",
            "trainer.max_steps=2",
            "trainer.num_generations=2",
            "trainer.prompts_per_step=2",
            "trainer.max_completion_length=12",
            "wandb.mode=disabled",
            "rollout.engine={max_model_len: 64, max_num_seqs: 16, num_kv_blocks: 64,"
            " speculative: ngram}",
        ],
    )
    summary = run_job(config)
    assert summary["steps"] == 2 and summary["weight_syncs"] >= 1
    parity = [d for d in summary["logprob_max_abs_diff"] if d is not None]
    assert parity and max(parity) < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["streaming", "sync"])
def test_multi_turn_episodes_train_in_both_modes(tmp_path, policy_dir, prompts_file, mode):
    """Episodes of a test environment (two tool outputs, then a reward of 0.5) through the
    actors into TRL: the environment's tokens masked out, its reward the only one."""
    from trainers.job import run_job
    from trainers.job.config_loading import load_config

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
            "trainer.max_completion_length=24",
            "wandb.mode=disabled",
            "rewards=[environment]",
            "environment.name=tests.integration.envs_for_tests:TwoToolCalls",
            "environment.max_turn_tokens=6",
            "rollout.engine={max_model_len: 64, max_num_seqs: 16, num_kv_blocks: 64}",
        ],
    )
    summary = run_job(config)
    assert summary["steps"] == 2 and summary["weight_syncs"] >= 1
    assert summary["reward_mean_last"] == pytest.approx(0.5)


def _tiny_job(tmp_path, policy_dir, prompts_file, name: str, *extra: str):
    from trainers.job.config_loading import load_config

    return load_config(
        None,
        [
            f"output_dir={tmp_path / name}",
            f"model={policy_dir}",
            f"dataset.source={prompts_file}",
            "trainer.num_generations=2",
            "trainer.prompts_per_step=2",
            "trainer.max_completion_length=8",
            "rollout.engine={max_model_len: 64, max_num_seqs: 16, num_kv_blocks: 64, block_size: 8}",
            "wandb.mode=disabled",
            *extra,
        ],
    )


@pytest.mark.slow
def test_resume_continues_steps_data_and_weights(tmp_path, policy_dir, prompts_file) -> None:
    """4 steps with a checkpoint every 2, then a run resumed from the step-2 checkpoint: it
    trains steps 3 and 4 only, starts at the saved dataset position, and its actors generate
    with the restored weights (their logprobs match the restored trainer's forward)."""
    from trainers.job import run_job

    first = run_job(
        _tiny_job(
            tmp_path, policy_dir, prompts_file, "a", "trainer.max_steps=4", "trainer.save_steps=2"
        )
    )
    assert first["steps"] == 4
    names = sorted(p.rsplit("/", 1)[-1] for p in first["checkpoints"])
    assert names == ["checkpoint-2", "checkpoint-4"]
    assert [s["step"] for s in first["checkpoint_saves"]] == [2, 4]
    assert all(s["gib"] > 0 and s["seconds"] > 0 for s in first["checkpoint_saves"])
    from pathlib import Path

    from trainers.job.resume import check_checkpoint

    # transformers' files (scheduler, RNG states, training args too) pass the resume checks.
    assert all(check_checkpoint(Path(c)) for c in first["checkpoints"]), "complete, marked"
    step2 = tmp_path / "a" / "checkpoint-2"
    saved = json.loads((step2 / "rollout_state.json").read_text())
    assert saved["model_version"] >= 2 and saved["dataset_position"] >= 4  # 2 steps x 2 prompts

    resumed = run_job(
        _tiny_job(
            tmp_path,
            policy_dir,
            prompts_file,
            "b",
            "trainer.max_steps=4",
            f"trainer.resume_from_checkpoint={step2}",
        )  # fmt: skip
    )
    assert resumed["resumed_from"] == str(step2)
    assert resumed["steps"] == 4
    assert resumed["dataset_position_at_start"] == saved["dataset_position"]
    parity = [d for d in resumed["logprob_max_abs_diff"] if d is not None]
    assert parity and parity[0] < 1e-4, "the actors got the restored weights before generating"
    state = json.loads((tmp_path / "b" / "checkpoint-4" / "trainer_state.json").read_text())
    trained_steps = [e["step"] for e in state["log_history"] if "loss" in e]
    assert trained_steps == [1, 2, 3, 4]  # steps 1-2 come from the checkpoint's history
    after = json.loads((tmp_path / "b" / "checkpoint-4" / "rollout_state.json").read_text())
    assert after["dataset_position"] > saved["dataset_position"]
    assert after["model_version"] > saved["model_version"]
    assert after["wandb_run_id"] == saved["wandb_run_id"], "the resumed run logs into the same run"


@pytest.mark.slow
def test_the_final_model_loads_in_transformers_and_the_engine(
    tmp_path, policy_dir, prompts_file
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rollout import EngineConfig, LLMEngine, SamplingParams
    from trainers.job import run_job

    summary = run_job(
        _tiny_job(
            tmp_path,
            policy_dir,
            prompts_file,
            "final",
            "trainer.max_steps=1",
            "trainer.save_steps=0",
        )
    )
    folder = summary["final_model"]
    assert summary["checkpoints"] == [] and summary["plot"].endswith("training.png")
    model = AutoModelForCausalLM.from_pretrained(folder)
    policy = AutoModelForCausalLM.from_pretrained(policy_dir)
    shapes = {k: v.shape for k, v in policy.state_dict().items()}
    assert {k: v.shape for k, v in model.state_dict().items()} == shapes
    assert AutoTokenizer.from_pretrained(folder).eos_token == "w2"
    engine = LLMEngine(EngineConfig(model=folder, device="cpu", max_model_len=64, max_num_seqs=2))
    result = engine.generate(["w3 w4 w5"], SamplingParams(max_tokens=4, temperature=0))[0]
    assert len(result.token_ids) > 0 and result.finish_reason in ("stop", "length")


def test_a_missing_model_is_one_line_before_ray_starts(tmp_path) -> None:
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "scripts/train_grpo.py", f"output_dir={tmp_path}", "model=/nonexistent"],
        cwd=root, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2
    assert "model=/nonexistent" in result.stderr and "Traceback" not in result.stderr
    assert "rollout actor" not in result.stdout, "the check came before Ray and the actors"


@pytest.mark.slow
def test_prompts_longer_than_the_engine_are_refused_at_start(
    tmp_path, policy_dir, prompts_file
) -> None:
    from trainers.job import run_job
    from trainers.job.preflight import JobInputError

    config = _tiny_job(
        tmp_path, policy_dir, prompts_file, "short",
        "rollout.engine={max_model_len: 3, max_num_seqs: 4}", "trainer.token_budget=64",
    )  # fmt: skip
    with pytest.raises(JobInputError, match=r"12 of 12 prompts are too long.*max_model_len=3"):
        run_job(config)
    import ray

    assert not ray.is_initialized()


def _job_past_step_one(out, policy_dir, prompts_file):
    """`scripts/train_grpo.py` for 200 steps in a process of its own, returned once it printed
    its first step's line."""
    import subprocess
    import sys
    from pathlib import Path

    job = subprocess.Popen(
        [
            sys.executable, "scripts/train_grpo.py", f"output_dir={out}", f"model={policy_dir}",
            f"dataset.source={prompts_file}", "trainer.max_steps=200", "trainer.num_generations=2",
            "trainer.prompts_per_step=2", "trainer.max_completion_length=8", "wandb.mode=disabled",
            "rollout.engine={max_model_len: 64, max_num_seqs: 16, num_kv_blocks: 64, block_size: 8}",
        ],
        cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    seen = []
    for line in job.stdout:
        seen.append(line)
        if line.startswith("[step 1/200]"):
            break
    assert seen and seen[-1].startswith("[step 1/200]"), "".join(seen[-30:])
    return job


def _ray_processes() -> set[int]:
    import subprocess

    listing = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    marks = ("raylet", "gcs_server", "ray::", "default_worker.py")
    return {int(line.split()[0]) for line in listing.splitlines() if any(m in line for m in marks)}


@pytest.mark.slow
def test_sigterm_stops_at_a_step_end_with_a_checkpoint_and_no_processes_left(
    tmp_path, policy_dir, prompts_file
) -> None:
    import signal
    import time
    from pathlib import Path

    before = _ray_processes()
    out = tmp_path / "stopped"
    job = _job_past_step_one(out, policy_dir, prompts_file)
    job.send_signal(signal.SIGTERM)
    start = time.monotonic()
    rest, _ = job.communicate(timeout=180)
    assert job.returncode == 0, rest[-3000:]
    assert time.monotonic() - start < 120
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_by"] == "SIGTERM" and 1 <= summary["steps"] < 200
    assert (out / f"checkpoint-{summary['steps']}" / "rollout_state.json").is_file()
    assert Path(summary["final_model"]).is_dir()
    time.sleep(2)
    assert _ray_processes() <= before, "Ray's processes ended with the job"


_KILL_AN_ACTOR = '''
import os
import signal
import subprocess
from pathlib import Path

MARK = Path(__file__).with_suffix(".killed")


def kill_an_actor(prompts, completions, **kwargs):
    """Scores nothing; on its first call kills one rollout actor's process, as a crash would."""
    if not MARK.exists():
        MARK.write_text("")
        listing = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True)
        pids = [int(l.split()[0]) for l in listing.stdout.splitlines() if "ray::RolloutWorker" in l]
        os.kill(max(pids), signal.SIGKILL)
    return [0.0] * len(completions)
'''


@pytest.mark.slow
def test_a_dead_actor_is_reported_and_the_run_goes_on(tmp_path, policy_dir, prompts_file, capsys):
    from trainers.job import run_job
    from trainers.job.config_loading import load_config

    rewards = tmp_path / "killing_rewards.py"
    rewards.write_text(_KILL_AN_ACTOR)
    config = load_config(
        None,
        [
            f"output_dir={tmp_path / 'run'}",
            f"model={policy_dir}",
            f"dataset.source={prompts_file}",
            f"rewards=[exact_answer, {rewards}:kill_an_actor]",
            "rollout.num_actors=2",
            "trainer.max_steps=3",
            "trainer.num_generations=2",
            "trainer.prompts_per_step=2",
            "trainer.max_completion_length=8",
            "wandb.mode=disabled",
            "rollout.engine={max_model_len: 64, max_num_seqs: 16, num_kv_blocks: 64, block_size: 8}",
        ],
    )
    summary = run_job(config)
    out = capsys.readouterr().out
    assert summary["steps"] == 3, "the run went on with the other actor"
    assert summary["num_actors"] == 2 and summary["actors_at_end"] == 1
    [death] = summary["actor_deaths"]
    assert death["actor"] in (0, 1) and death["step"] is not None and death["after_s"] > 0
    assert f"[train_grpo] rollout actor {death['actor']} died at step" in out
    assert "1 of 2 actor(s) go on" in out
    history = json.loads((tmp_path / "run" / "checkpoint-3" / "trainer_state.json").read_text())
    logs = history["log_history"]
    assert [e["rollout/actor_died"] for e in logs if "rollout/actor_died" in e] == [death["actor"]]
    assert logs[-1]["rollout/live_actors"] == 1


@pytest.mark.slow
def test_a_killed_job_leaves_no_ray_process_behind(tmp_path, policy_dir, prompts_file) -> None:
    """SIGKILL runs no code in the job: its watcher ends the Ray session's processes (Ray's own
    agents would otherwise linger for up to a minute), then itself."""
    import subprocess
    import time

    before = _ray_processes()
    job = _job_past_step_one(tmp_path / "killed", policy_dir, prompts_file)
    assert _ray_processes() - before, "the job runs Ray processes of its own"
    job.kill()
    job.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _ray_processes() - before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _ray_processes() - before, "Ray's processes outlived the killed job"
    listing = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True).stdout
    assert "session_tree" not in listing, "the watcher ended too"


FAILING_REWARD = """
REASON = "no answer " + "key"  # built here, so no traceback line quotes the message


def judge(prompts, completions, **columns):
    return _ask(completions)


def _ask(completions):
    raise ValueError(REASON)
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["streaming", "sync"])
def test_a_raising_reward_ends_the_run_with_one_line_naming_it(
    tmp_path, policy_dir, prompts_file, mode
) -> None:
    """Exit 1; where the reward raised printed once, then a last line naming the function and
    the exception: not a chain of wrappers ending in 'rollout worker failed'."""
    reward = tmp_path / "my_rewards.py"
    reward.write_text(FAILING_REWARD)
    result = _run_script(
        tmp_path, policy_dir, prompts_file, mode, f"rewards=[{reward}:judge]", "trainer.max_steps=1"
    )
    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.rstrip("\n").splitlines()[-1]
    assert last == (
        f"train_grpo.py: error: reward function '{reward}:judge' raised ValueError: no answer key"
    ), result.stderr[-3000:]
    assert result.stderr.count("no answer key") == 1, result.stderr
    assert result.stderr.count("Traceback (most recent call last)") == 1, result.stderr
    assert "raise ValueError(REASON)" in result.stderr, "the user's frame is shown"
    assert "rollout worker failed" not in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["streaming", "sync"])
def test_a_diverged_step_ends_the_run_with_one_line_and_syncs_nothing(
    tmp_path, policy_dir, prompts_file, mode
) -> None:
    """A learning rate past float32's range makes the first step's weights infinite: the sync
    after it is refused before any actor is touched, and the run ends with exit 1 and one line
    saying what to change (no traceback)."""
    rewards = tmp_path / "alternate.py"  # a nonzero advantage whatever is sampled
    rewards.write_text(
        "def alternate(prompts, completions, **kw):\n"
        "    return [float(i % 2) for i in range(len(completions))]\n"
    )
    result = _run_script(
        tmp_path, policy_dir, prompts_file, mode, f"rewards=[{rewards}:alternate]",
        "trainer.learning_rate=1e300", "trainer.max_steps=3",
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.rstrip("\n").splitlines()[-1]
    assert last.startswith("train_grpo.py: error: the trainer's weights hold NaN or infinity ("), (
        result.stderr[-3000:]
    )
    assert "the weight sync was refused" in last and "lower the learning rate" in last
    assert "Traceback (most recent call last)" not in result.stderr, result.stderr[-3000:]


def _run_script(tmp_path, policy_dir, prompts_file, mode, *overrides):
    """scripts/train_grpo.py as a user runs it: a tiny job of 2 prompts x 2 samples of up to 8
    tokens, W&B off, plus `overrides`; the finished process (stdout, stderr, exit status)."""
    import subprocess
    import sys
    from pathlib import Path

    return subprocess.run(
        [
            sys.executable, "scripts/train_grpo.py", f"output_dir={tmp_path / 'run'}",
            f"model={policy_dir}", f"dataset.source={prompts_file}", f"trainer.mode={mode}",
            "trainer.prompts_per_step=2", "trainer.num_generations=2",
            "trainer.max_completion_length=8", "wandb.mode=disabled",
            "rollout.engine={max_model_len: 64, max_num_seqs: 16, num_kv_blocks: 64, block_size: 8}",
            *overrides,
        ],
        cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
