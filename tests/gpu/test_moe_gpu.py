"""The fused MoE experts kernel on the GPU: against its twin, and in the engine against
transformers' generate, with CUDA graphs equal to eager."""

from __future__ import annotations

import pytest
import torch

from rollout import SamplingParams
from rollout.kernels.torch_moe import fused_experts_reference
from tests import model_zoo
from tests.conftest import engine_for, random_prompts

pytestmark = pytest.mark.gpu

PROMPTS = random_prompts((1, 5, 16, 17, 33, 50, 64, 9, 2), seed=21)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 32, 128, 2000, 8192])
def test_kernel_equals_twin(tokens: int, dtype: torch.dtype) -> None:
    """Decode batches (a few pairs per expert, many experts unpicked) and prefill chunks
    (hundreds per expert; 8,192 tokens take the prefill tiles in bf16), at a Qwen3-30B-A3B-like
    width scaled down."""
    from rollout.kernels.triton_moe import fused_experts

    g = torch.Generator(device="cuda").manual_seed(tokens)
    experts, top_k, hidden, inter = 128, 8, 512, 192
    x = torch.randn(tokens, hidden, generator=g, device="cuda").to(dtype)
    logits = torch.randn(tokens, experts, generator=g, device="cuda")
    weights, index = torch.softmax(logits, -1).topk(top_k, dim=-1)
    gate_up = (torch.randn(experts, 2 * inter, hidden, generator=g, device="cuda") / 20).to(dtype)
    down = (torch.randn(experts, hidden, inter, generator=g, device="cuda") / 12).to(dtype)
    got = fused_experts(x, index, weights, gate_up, down)
    want = fused_experts_reference(x, index, weights, gate_up, down)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("experts", [128, 60])
@pytest.mark.parametrize("tokens", [1, 8, 32, 64, 128, 700, 2048])
def test_counting_sort_equals_the_twins_stable_sort(tokens: int, experts: int) -> None:
    """The pairs' expert order, counts and starts, exactly; 2,048 tokens x 8 is the most pairs
    the counting sort takes, 700 x 8 is more than one chunk and not a multiple of it."""
    from rollout.kernels.torch_moe import sort_by_expert
    from rollout.kernels.triton_expert_sort import COUNTING_SORT_MAX_PAIRS, sort_pairs_by_expert

    assert tokens * 8 <= COUNTING_SORT_MAX_PAIRS
    g = torch.Generator(device="cuda").manual_seed(tokens)
    logits = torch.randn(tokens, experts, generator=g, device="cuda")
    index = logits.topk(8, dim=-1).indices
    for got, want in zip(
        sort_pairs_by_expert(index, experts), sort_by_expert(index, experts), strict=True
    ):
        assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("model_type", ["qwen3_moe", "qwen2_moe", "olmoe", "mixtral"])
def test_routing_kernel_equals_each_routers_own_forward(model_type: str, dtype) -> None:
    """128 experts, top-8, 1 to 300 tokens (one program and many). The experts exactly, except
    that bf16 logits can tie at the k-th place, where either is a top-k: there the same logits."""
    from rollout.engine.model.fused_routing import fused_router_forward, router_code

    model = model_zoo.tiny_model(
        model_type, num_experts=128, num_local_experts=128, num_experts_per_tok=8
    ).to("cuda", dtype)
    router = next(m for m in model.modules() if router_code(m) is not None)
    g = torch.Generator(device="cuda").manual_seed(5)
    for tokens in (1, 16, 300):
        x = torch.randn(tokens, router.hidden_dim, generator=g, device="cuda").to(dtype)
        with torch.no_grad():
            want_logits, want_weights, want_index = router(x)
            logits, weights, index = fused_router_forward(router, x)
        assert torch.equal(logits, want_logits) and weights.dtype == want_weights.dtype
        top = logits.float().topk(9, dim=-1).values
        clear = top[:, 7] != top[:, 8]  # no tie at the k-th place
        assert torch.equal(index.sort(-1).values[clear], want_index.sort(-1).values[clear])
        chosen = logits.float().gather(1, index).sort(-1, descending=True).values
        assert torch.equal(chosen, top[:, :8])  # every row: a top-8 by the logits
        by_expert = weights.gather(1, index.argsort(-1))[clear].float()
        want_by_expert = want_weights.gather(1, want_index.argsort(-1))[clear].float()
        tol = 1e-6 if dtype == torch.float32 else 8e-3
        torch.testing.assert_close(by_expert, want_by_expert, rtol=tol, atol=tol)


ON_GPU = dict(
    device="cuda",
    dtype="float32",
    max_model_len=256,
    max_num_seqs=16,
    max_num_batched_tokens=48,
    num_kv_blocks=24,  # preemption, as in test_engine_gpu.py
    attention="triton",
    compile_model=False,
)


def test_greedy_equals_transformers_with_the_fused_experts() -> None:
    model = model_zoo.tiny_model("qwen3_moe").to("cuda")
    expected = [model_zoo.hf_greedy(model, p, 40) for p in PROMPTS]
    engine = engine_for(model, ON_GPU)
    prepared = engine.debug_internals().runner.prepared
    assert prepared.fused_experts_configs, prepared.fused_experts_declined
    assert len(prepared.fused_routers) == model.config.num_hidden_layers
    results = engine.generate(PROMPTS, SamplingParams(max_tokens=40, temperature=0))
    assert [r.token_ids for r in results] == expected
    assert engine.stats().preemptions > 0
    # fp32 MoE captured: the kernel reads no routing on the host.
    assert engine.stats().cuda_graphs > 0
    # Outside a step the model is transformers' own again.
    assert engine.model.config._experts_implementation != "rollout_fused"
    assert all("forward" not in vars(m) for m, _ in prepared.fused_routers)


@pytest.mark.parametrize("compile_model", [False, True])
def test_graphs_equal_eager_with_the_fused_experts(compile_model: bool) -> None:
    model = model_zoo.tiny_model("qwen3_moe").to("cuda", torch.bfloat16)
    sampled = SamplingParams(max_tokens=40, temperature=1.0, n=2, seed=3)
    settings = dict(num_kv_blocks=200, dtype="bfloat16", compile_model=compile_model)
    graphed = engine_for(model, ON_GPU, **settings)
    a = graphed.generate(PROMPTS, sampled)
    assert graphed.stats().cuda_graphs > 0
    b = engine_for(model, ON_GPU, cuda_graphs=False, **settings).generate(PROMPTS, sampled)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]


def test_fused_experts_agree_with_transformers_experts_in_bf16() -> None:
    model = model_zoo.tiny_model("mixtral").to("cuda", torch.bfloat16)
    params = SamplingParams(max_tokens=32, temperature=0)
    settings = dict(num_kv_blocks=200, dtype="bfloat16", cuda_graphs=False)
    plain = engine_for(model, ON_GPU, fused_moe=False, fused_routing=False, **settings).generate(
        PROMPTS, params
    )
    fused = engine_for(model, ON_GPU, **settings).generate(PROMPTS, params)
    assert [r.token_ids[:2] for r in fused] == [r.token_ids[:2] for r in plain]
    same = sum(
        a == b
        for x, y in zip(plain, fused, strict=True)
        for a, b in zip(x.token_ids, y.token_ids, strict=True)
    )
    assert same / sum(len(r.token_ids) for r in plain) > 0.8  # bf16: rounding may flip a near-tie


ROUTES = dict(ON_GPU, num_kv_blocks=200, enable_prefix_caching=False, record_routes=True)


def _own_routes(model, token_ids: list[int]):
    """What the model's routers choose in a plain forward over all but the last token."""
    import numpy as np

    from trainers.trl_adapter.routing_replay import own_routes

    return np.sort(own_routes(model, torch.tensor(token_ids[:-1], device="cuda")), axis=-1)


@pytest.mark.parametrize("compile_model", [False, True])
def test_recorded_routes_under_graphs_equal_eager_and_transformers(compile_model: bool) -> None:
    """Routes written inside captured (and compiled) steps and copied out with the tokens."""
    import numpy as np

    model = model_zoo.tiny_model("qwen3_moe").to("cuda")
    params = SamplingParams(max_tokens=40, temperature=1.0, n=2, seed=3)
    graphed = engine_for(model, ROUTES, compile_model=compile_model)
    assert graphed.debug_internals().runner.prepared.route_recorder is not None
    a = graphed.generate(PROMPTS, params)
    assert graphed.stats().cuda_graphs > 0
    b = engine_for(model, ROUTES, cuda_graphs=False, compile_model=compile_model).generate(
        PROMPTS, params
    )
    agree = total = 0
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids
        assert np.array_equal(x.routes, y.routes)
        full = x.prompt_token_ids + x.token_ids
        assert x.routes.shape[0] == len(full) - 1
        agree += (np.sort(x.routes, axis=-1) == _own_routes(model, full)).all(-1).sum()
        total += x.routes.shape[0] * x.routes.shape[1]
    assert agree / total > 0.999, agree / total  # fp32: only a rare near tie may differ


def test_replayed_routes_give_transformers_the_engines_logprobs_on_the_gpu() -> None:
    from tests.conftest import near_tie_moe
    from trainers.trl_adapter.routing_replay import RouteReplay, replay_kwargs

    model = near_tie_moe().to("cuda")
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=5)
    results = engine_for(model, ROUTES).generate(PROMPTS, params)
    RouteReplay(model)  # after the engine took its copy
    worst = {False: 0.0, True: 0.0}
    for r in results:
        full = r.prompt_token_ids + r.token_ids
        ids = torch.tensor([full], device="cuda")
        for replay in (False, True):
            extra = replay_kwargs(r.routes, len(full), "cuda") if replay else {}
            with torch.no_grad():
                logits = model(ids, **extra).logits[0, len(r.prompt_token_ids) - 1 : -1].float()
            lp = logits.log_softmax(-1).gather(1, ids[0, len(r.prompt_token_ids) :, None])[:, 0]
            gap = (lp.cpu() - torch.tensor(r.logprobs)).abs().max().item()
            worst[replay] = max(worst[replay], gap)
    assert worst[True] < 1e-3 < worst[False], worst
