"""Multi-turn episodes in a rollout worker on CPU: continuation is exact, environments run off
the engine's thread, and a slow, failing or hanging environment ends only its own episode."""

from __future__ import annotations

import time

import pytest
import torch

from rollout import EngineConfig, SamplingParams
from rollout.actors.messages import GroupRequest
from rollout.actors.worker import RolloutWorker
from rollout.environments import EpisodeLimits

ENVS = "tests.integration.envs_for_tests"


@pytest.fixture
def worker(policy_dir):
    config = EngineConfig(
        model=policy_dir, device="cpu", dtype="float32", max_model_len=128, max_num_seqs=16
    )
    worker = RolloutWorker(config)
    yield worker
    worker.shutdown()


def _run(worker, groups: list[GroupRequest], timeout: float = 60.0) -> dict:
    worker.add_groups(groups)
    expected = sum(g.params.n for g in groups)
    samples, deadline = [], time.monotonic() + timeout
    while len(samples) < expected:
        assert time.monotonic() < deadline, f"{len(samples)} of {expected} samples came back"
        samples += worker.poll(timeout=1.0)
    return {(s.group_id, s.sample_index): s for s in samples}


def _group(group_id: int, env: str, n: int = 2, row: dict | None = None, **limits) -> GroupRequest:
    params = SamplingParams(max_tokens=6, n=n, seed=group_id, ignore_eos=True)
    return GroupRequest(group_id, [], params, environment=f"{ENVS}:{env}", row=row or {},
                        limits=EpisodeLimits(**limits))  # fmt: skip


def test_an_episode_is_one_sample_with_the_models_tokens_masked_in(worker, policy_dir) -> None:
    from transformers import AutoModelForCausalLM

    samples = _run(worker, [_group(1, "TwoToolCalls", n=3)])
    model = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32).eval()
    for s in samples.values():
        assert s.episode_status == "done" and s.finish_reason == "stop" and s.reward == 0.5
        assert s.num_turns == 3
        # Three model turns of 6 tokens, two tool outputs of 2: [1]*6 [0]*2 [1]*6 [0]*2 [1]*6.
        assert s.completion_mask == [1] * 6 + [0] * 2 + [1] * 6 + [0] * 2 + [1] * 6
        assert s.token_ids[6:8] == [11, 41] and s.token_ids[14:16] == [12, 42]
        # The model's logprobs are those of one fresh forward over the whole episode.
        ids = torch.tensor([s.prompt_token_ids + s.token_ids])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
        start = len(s.prompt_token_ids)
        for i, (token, got, mask) in enumerate(
            zip(s.token_ids, s.logprobs, s.completion_mask, strict=True)
        ):
            want = logprobs[start + i - 1, token].item() if mask else 0.0
            assert abs(got - want) < 1e-4, (i, got, want)
    assert len({tuple(s.token_ids) for s in samples.values()}) == 3, "each sample its own seed"
    # Later turns found the earlier turns' blocks in the prefix cache.
    assert worker.engine.stats().prefix_hit_tokens > 0


def test_a_slow_environment_does_not_hold_up_other_episodes(worker) -> None:
    worker.add_groups([_group(1, "SlowFirstEpisode", n=1, row={"slow": True})])
    start = time.monotonic()
    fast = _run(worker, [_group(2, "SlowFirstEpisode", n=2)])
    assert time.monotonic() - start < 1.5, "the fast group waited for the slow one's tool"
    assert all(s.episode_status == "done" for s in fast.values())
    slow = []
    while not slow:
        slow += worker.poll(timeout=5.0)
    assert slow[0].group_id == 1 and slow[0].episode_status == "done"


@pytest.mark.parametrize(
    ("env", "status", "limits"),
    [
        ("Raises", "tool_error", {}),
        ("ReturnsNone", "tool_error", {}),
        ("ResetReturnsNone", "tool_error", {}),
        ("NeverEnds", "tool_timeout", {"tool_timeout_s": 0.5}),
        ("AsyncNeverEnds", "tool_timeout", {"tool_timeout_s": 0.5}),
        ("NeverDone", "max_turns", {"max_turns": 3}),
        ("NeverDone", "max_tokens", {"max_tokens": 20}),
    ],
)
def test_an_environment_that_fails_ends_its_episode_with_a_status(worker, env, status, limits):
    samples = _run(worker, [_group(1, env, **limits), _group(2, "AsyncTool")], timeout=20)
    for j in range(2):
        failed = samples[(1, j)]
        assert failed.episode_status == status
        assert failed.finish_reason == ("length" if status.startswith("max") else "error")
        if failed.finish_reason == "error":
            assert failed.error.startswith(status) and failed.reward is None
        assert len(failed.token_ids) == len(failed.completion_mask) == len(failed.logprobs)
        assert samples[(2, j)].episode_status == "done"  # the other group went on
    if status == "max_turns":
        assert samples[(1, 0)].num_turns == 3
    if status == "max_tokens":
        assert len(samples[(1, 0)].token_ids) <= 20


def test_aborting_a_group_ends_its_episodes_and_frees_the_engine(worker) -> None:
    worker.add_groups([_group(1, "NeverEnds", tool_timeout_s=60)])
    time.sleep(0.5)  # its first turn is done; its tool call hangs
    worker.abort([1])
    samples = []
    while len(samples) < 2:
        samples += worker.poll(timeout=5.0)
    assert {s.episode_status for s in samples} == {"abort"}
    assert {s.finish_reason for s in samples} == {"abort"}
    assert not worker.engine.has_unfinished()


def test_a_missing_environment_is_refused_with_a_clear_message() -> None:
    from rollout.environments import load_environment

    with pytest.raises(ValueError, match="has no attribute 'Nope'"):
        load_environment(f"{ENVS}:Nope")
    with pytest.raises(ValueError, match="file .* not found"):
        load_environment("no/such/file.py:Env")


def test_aborting_a_group_while_its_turn_generates(policy_dir) -> None:
    """The turn's abort result reaches the runner after its group has ended: it is dropped."""
    import threading

    from rollout import LLMEngine
    from rollout.environments.episodes import EpisodeRunner

    config = EngineConfig(model=policy_dir, device="cpu", dtype="float32", max_model_len=128)
    engine = LLMEngine(config)
    runner = EpisodeRunner(engine, wake=threading.Event().set)
    params = SamplingParams(max_tokens=50, n=2, seed=1, ignore_eos=True)
    runner.start("g", f"{ENVS}:TwoToolCalls", {}, params, EpisodeLimits(max_tokens=80))
    while not engine.has_unfinished():  # the resets come back, the first turn starts
        runner.poll()
    engine.step()
    runner.abort("g")
    runner.poll()
    assert not runner.busy and {e.status for e in runner.finished} == {"abort"}
    while engine.has_unfinished():
        for c in engine.step():
            assert c.finish_reason == "abort"
            runner.on_completion(c)
    runner.shutdown()
