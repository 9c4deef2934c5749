"""MoE routes: the engine records the experts each token chose; the trainer's forward replays them.

Ground truth is transformers' own routers on CPU in fp32: the engine's recorded routes are the
ones a plain forward over the same tokens chooses. On a model whose routers nearly tie, the
engine's and a plain forward's routes differ (their attention sums in another order), and only
with the routes replayed do the trainer's logprobs equal the rollout's.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from rollout import SamplingParams
from tests.conftest import engine_for, near_tie_moe, random_prompts, tiny_model
from trainers.trl_adapter.routing_replay import ROUTES_KWARG, RouteReplay, trainer_routes

SMALL = dict(
    block_size=4,
    max_model_len=128,
    max_num_seqs=8,
    max_num_batched_tokens=12,  # < the longest prompt: chunked prefill
    num_kv_blocks=64,
    device="cpu",
    dtype="float32",
    enable_prefix_caching=False,
    record_routes=True,
)


def own_routes(model, token_ids: list[int]) -> np.ndarray:
    """[len - 1, num_routers, top_k]: what the model's routers choose in a plain forward over
    all but the last token (the tokens a rollout feeds)."""
    from trainers.trl_adapter.routing_replay import own_routes as chosen

    return chosen(model, torch.tensor(token_ids[:-1]))


def same_sets(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (np.sort(a, axis=-1) == np.sort(b, axis=-1)).all(axis=-1)


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_engine_records_the_routes_transformers_chooses(overlap: bool) -> None:
    model = tiny_model("qwen3_moe", seed=2)
    prompts = random_prompts((5, 17, 30), seed=3)
    engine = engine_for(model, SMALL, overlap=overlap)
    params = SamplingParams(max_tokens=10, temperature=1.0, n=3, seed=7)
    results = engine.generate(prompts, params)
    assert len(results) == 9
    for r in results:
        full = r.prompt_token_ids + r.token_ids
        assert r.routes is not None and r.routes.dtype == np.uint8
        assert r.routes.shape == (len(full) - 1, 2, 2)  # 2 MoE layers, top-2
        expected = own_routes(model, full)
        assert same_sets(r.routes, expected).all(), "the engine recorded other experts"
    for g in range(3):  # a group's samples share the prompt's routes (computed once)
        group = results[3 * g : 3 * g + 3]
        p = len(group[0].prompt_token_ids)
        assert all(np.array_equal(s.routes[:p], group[0].routes[:p]) for s in group)


def test_overlap_and_sync_record_the_same_routes() -> None:
    model = tiny_model("qwen3_moe", seed=4)
    prompts = random_prompts((3, 9, 21), seed=5)
    params = SamplingParams(max_tokens=12, temperature=0.8, n=2, seed=1)
    runs = [engine_for(model, SMALL, overlap=o).generate(prompts, params) for o in (False, True)]
    for a, b in zip(*runs, strict=True):
        assert a.token_ids == b.token_ids
        assert np.array_equal(a.routes, b.routes)


def test_speculating_engine_keeps_only_the_accepted_tokens_routes() -> None:
    model = tiny_model("qwen3_moe", seed=2)
    prompt = [5, 6, 7, 8] * 6  # repetitive: n-gram drafts get proposed and some accepted
    engine = engine_for(model, SMALL, overlap=True, speculative="ngram", num_speculative_tokens=3)
    (r,) = engine.generate([prompt], SamplingParams(max_tokens=24, temperature=0))
    assert engine.stats().speculation.accepted > 0, "the test needs accepted drafts"
    full = r.prompt_token_ids + r.token_ids
    assert same_sets(r.routes, own_routes(model, full)).all()


def test_record_routes_is_refused_where_it_cannot_hold() -> None:
    with pytest.raises(ValueError, match="enable_prefix_caching=False"):
        engine_for(tiny_model("qwen3_moe"), {**SMALL, "enable_prefix_caching": True})
    with pytest.raises(ValueError, match="has none"):
        engine_for(tiny_model("llama"), SMALL)


def trainer_logprobs(model, full: list[int], prompt_len: int, routes=None) -> torch.Tensor:
    kwargs = {}
    if routes is not None:
        kwargs[ROUTES_KWARG] = torch.from_numpy(trainer_routes(routes))[None]
        # the last token is fed in training but never was in the rollout: no route
        pad = torch.full((1, 1, *kwargs[ROUTES_KWARG].shape[2:]), -1, dtype=torch.int32)
        kwargs[ROUTES_KWARG] = torch.cat([kwargs[ROUTES_KWARG], pad], dim=1)
    logits = model(torch.tensor([full]), **kwargs).logits[0, prompt_len - 1 : -1].float()
    logps = torch.log_softmax(logits, dim=-1)
    return logps.gather(1, torch.tensor(full[prompt_len:])[:, None])[:, 0]


def test_replayed_routes_give_the_trainer_the_rollouts_logprobs() -> None:
    rollout_model = near_tie_moe()
    trainer_model = copy.deepcopy(rollout_model)
    replay = RouteReplay(trainer_model)
    prompts = random_prompts((6, 11, 19, 25), seed=9)
    engine = engine_for(rollout_model, SMALL, overlap=True)
    results = engine.generate(prompts, SamplingParams(max_tokens=16, temperature=1.0, seed=3))
    flipped = max_without = max_with = 0.0
    for r in results:
        full, p = r.prompt_token_ids + r.token_ids, len(r.prompt_token_ids)
        rollout = torch.tensor(r.logprobs)
        with torch.no_grad():
            plain = trainer_logprobs(trainer_model, full, p)
            replayed = trainer_logprobs(trainer_model, full, p, r.routes)
        flipped += (~same_sets(r.routes, own_routes(trainer_model, full))).sum()
        max_without = max(max_without, float((plain - rollout).abs().max()))
        max_with = max(max_with, float((replayed - rollout).abs().max()))
    assert flipped > 0, "the near-tie routers must choose differently in the two forwards"
    assert max_without > 1e-3, max_without
    assert max_with < 1e-5, max_with  # fp32 precision: the same experts, the same logprobs
    counts = replay.take_counts()
    assert 0 < counts["routing/flipped_fraction"] < 1


def test_replay_keeps_the_routers_gradient_and_leaves_plain_forwards_alone() -> None:
    model = tiny_model("qwen3_moe", seed=6)
    reference = copy.deepcopy(model)
    RouteReplay(model)
    ids = random_prompts((12,), seed=2)[0]
    plain = model(torch.tensor([ids])).logits
    assert torch.equal(plain, reference(torch.tensor([ids])).logits)  # no routes: own routing
    routes = own_routes(reference, ids + [0]).astype(np.int32)  # routes of all 12 tokens
    replayed = model(torch.tensor([ids]), **{ROUTES_KWARG: torch.from_numpy(routes)[None]})
    assert torch.equal(replayed.logits, plain)  # its own choices replayed: the same forward
    replayed.logits.logsumexp(-1).sum().backward()
    for layer in model.model.layers:
        assert layer.mlp.gate.weight.grad.abs().sum() > 0, "the router lost its gradient"
    with pytest.raises(ValueError, match="must match the batch"):
        model(torch.tensor([ids[:5]]), **{ROUTES_KWARG: torch.from_numpy(routes)[None]})


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["streaming", "sync"])
@pytest.mark.parametrize("replay", [True, False], ids=["replay", "own-routes"])
def test_jobs_train_on_the_rollouts_routes(tmp_path, near_tie_moe_dir, prompts_file, mode, replay):
    """A near-tie MoE policy trained without moving its weights (a learning rate below their rounding): whatever the
    trainer's logprobs differ from the rollout's by is routing. With trainer.routing_replay the
    step's KL and the parity probe are at fp32 precision, and some routes were flipped back;
    without it they are not."""
    from trainers.job import run_job
    from trainers.job.config_loading import load_config

    config = load_config(
        None,
        [
            f"output_dir={tmp_path / 'run'}",
            f"model={near_tie_moe_dir}",
            f"dataset.source={prompts_file}",
            f"trainer.mode={mode}",
            f"trainer.routing_replay={str(replay).lower()}",
            "trainer.learning_rate=1e-12",  # > 0, yet below fp32 rounding of every weight
            "trainer.max_steps=2",
            "trainer.num_generations=2",
            "trainer.prompts_per_step=2",
            "trainer.max_completion_length=12",
            "trainer.temperature=1.0",
            "wandb.mode=disabled",
            "rollout.engine={max_model_len: 64, max_num_seqs: 16, num_kv_blocks: 64}",
        ],
    )
    summary = run_job(config)
    assert summary["steps"] == 2
    kl = summary["off_policy"]["kl"]
    parity = [d for d in summary["logprob_max_abs_diff"] if d is not None]
    if replay:
        assert summary["routing_flipped_fraction"] > 0, "no route needed replaying"
        assert abs(kl) < 1e-6, kl
        assert parity and max(parity) < 1e-4, parity
    else:
        assert summary["routing_flipped_fraction"] is None
        assert abs(kl) > 1e-4, kl


def test_routing_replay_of_a_dense_policy_is_refused_before_the_job_starts(policy_dir) -> None:
    from trainers.job.config_loading import load_config
    from trainers.job.preflight import JobInputError, _routing_replay

    config = load_config(None, [f"model={policy_dir}", "trainer.routing_replay=true"])
    with pytest.raises(JobInputError, match="trainer.routing_replay=true with model=.*has none"):
        _routing_replay(config, policy_dir)
