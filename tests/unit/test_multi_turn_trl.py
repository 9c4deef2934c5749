"""What TRL receives from multi-turn episodes: the environment's tokens masked out of the loss,
the environment's reward as a column, in both trainer modes (no Ray, a stand-in pool); and a
failing reward surfacing from the streaming worker as it is."""

from __future__ import annotations

import queue
from types import SimpleNamespace

import numpy as np
import pytest

from rollout.actors.messages import CompletedGroup, FinishedSample
from rollout.engine.sampling_params import SamplingParams
from trainers.task.rewards import environment

pytest.importorskip("trl")


def _sample(group_id: int, index: int) -> FinishedSample:
    return FinishedSample(
        group_id=group_id, attempt=0, sample_index=index, prompt_token_ids=[5, 6],
        token_ids=[7, 8, 30, 31, 9], logprobs=[-0.5, -0.25, 0.0, 0.0, -1.0],
        finish_reason="stop", error=None, weight_versions=(0, 0), actor=0, received_at=0.0,
        finished_at=0.0, completion_mask=[1, 1, 0, 0, 1], reward=0.25 * (index + 1),
        episode_status="done", num_turns=2,
    )  # fmt: skip


class _Pool:
    def __init__(self) -> None:
        self.submitted: list[dict] = []
        self._done: queue.Queue = queue.Queue()

    def submit(self, prompt_ids, params, metadata=None, **kwargs) -> int:
        group_id = len(self.submitted)
        self.submitted.append(kwargs)
        self._done.put(CompletedGroup(group_id, [_sample(group_id, j) for j in range(params.n)]))
        return group_id

    def get(self, timeout=None) -> CompletedGroup:
        return self._done.get(timeout=timeout)


def test_the_streaming_sample_masks_the_environments_tokens() -> None:
    from trainers.trl_adapter.rollout_worker import rollout_sample

    s = _sample(0, 0)
    row = rollout_sample("q", "a", s.prompt_token_ids, s.token_ids, s.logprobs, 1.0, 0, 0, {},
                         completion_mask=s.completion_mask)  # fmt: skip
    np.testing.assert_array_equal(row.completion_mask, [0, 0, 1, 1, 0, 0, 1])
    np.testing.assert_array_equal(row.input_ids, [5, 6, 7, 8, 30, 31, 9])
    with pytest.raises(AssertionError, match="one mask entry per completion token"):
        rollout_sample("q", "a", [5], [7, 8], [0.0, 0.0], 1.0, 0, 0, {}, completion_mask=[1])


def test_the_sync_rollout_func_gives_trl_env_mask_and_env_reward() -> None:
    from trainers.trl_adapter.sync import make_rollout_func

    rows = [{"prompt": "w3 w4", "answer": "1"}, {"prompt": "w5 w6", "answer": "2"}]
    pool = _Pool()
    rollout_func = make_rollout_func(
        pool, formatter=None, sampling=SamplingParams(max_tokens=8),
        before_generation=lambda trainer: None, environment="pkg.envs:Env", rows=rows,
    )  # fmt: skip
    trainer = SimpleNamespace(
        args=SimpleNamespace(num_generations=2), accelerator=SimpleNamespace(num_processes=1)
    )
    out = rollout_func(["w5 w6", "w5 w6", "w3 w4", "w3 w4"], trainer)
    assert [kw["row"] for kw in pool.submitted] == [rows[1], rows[0]]  # each prompt's own row
    assert all(kw["environment"] == "pkg.envs:Env" for kw in pool.submitted)
    assert out["env_mask"] == [[1, 1, 0, 0, 1]] * 4
    assert out["env_reward"] == [0.25, 0.5, 0.25, 0.5]
    assert environment([], [], env_reward=[0.25, None]) == [0.25, 0.0]


def test_the_streaming_worker_surfaces_a_failing_reward_as_it_is() -> None:
    """Not wrapped in a generic 'rollout worker failed': train_grpo.py reports it in one line."""
    from trainers.task.reward_loading import RewardFunctionError
    from trainers.trl_adapter.rollout_worker import PoolRolloutWorker

    def judge(prompts, completions, **columns):
        raise ValueError("no judge")

    formatter = SimpleNamespace(prompt_ids=lambda prompt: [5, 6], completion=lambda ids, p: "a")
    worker = PoolRolloutWorker(
        _Pool(), [{"prompt": "w3 w4", "answer": "1"}], formatter, [judge],
        SamplingParams(n=2, max_tokens=8), max_inflight_groups=1,
    )  # fmt: skip
    worker.start()
    worker._thread.join(timeout=30)
    assert not worker._thread.is_alive(), "the worker stops at the failing reward"
    with pytest.raises(RewardFunctionError) as info:
        worker.check_health(stale_after_s=60)
    assert str(info.value) == "reward function 'judge' raised ValueError: no judge"
    assert isinstance(info.value.original, ValueError)


def test_the_calculator_evaluates_arithmetic_only_and_scores_the_last_number() -> None:
    from rollout.environments.calculator import CalculatorEnv, evaluate

    assert evaluate("(3 + 4) * 2 - 1 / 2") == 13.5
    for bad in ("__import__('os')", "2 ** 99999", "x + 1", "1 +"):
        with pytest.raises(ValueError):
            evaluate(bad)
    env = CalculatorEnv()
    prompt = env.reset({"prompt": [{"role": "user", "content": "2 + 5?"}], "answer": "7"})
    assert "<calc>" in prompt[-1]["content"]
    call = env.step("Ava has <calc>2 + 5</calc>")
    assert not call.done and call.observation == "<result>7</result>"
    assert env.step("<calc>1 / 0</calc>").observation == "<result>error</result>"
    assert env.step("so 7 apples. Answer: 7").reward == 1.0
    assert env.step("Answer: 8").reward == 0.0
