"""The engine on the GPU: transformers parity, CUDA graphs == eager, overlap == sync."""

from __future__ import annotations

import pytest
import torch

from rollout import SamplingParams
from tests.conftest import engine_for, hf_greedy, random_prompts, tiny_model

pytestmark = pytest.mark.gpu


def _gpu_model(arch: str = "llama"):
    return tiny_model(arch).to("cuda")


ON_GPU = dict(
    device="cuda",
    dtype="float32",
    block_size=16,
    max_model_len=256,
    max_num_seqs=16,
    max_num_batched_tokens=48,
    num_kv_blocks=24,  # 384 tokens for up to 9 x 90: preemption
    attention="triton",
    compile_model=False,  # exactness tests: eager modules, same ops as transformers
)


PROMPTS = random_prompts((1, 5, 16, 17, 33, 50, 64, 9, 2), seed=21)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_equals_transformers_on_gpu(arch: str) -> None:
    model = _gpu_model(arch)
    expected = [hf_greedy(model, p, 40) for p in PROMPTS]
    engine = engine_for(model, ON_GPU)
    results = engine.generate(PROMPTS, SamplingParams(max_tokens=40, temperature=0))
    assert [r.token_ids for r in results] == expected
    assert engine.stats().preemptions > 0
    assert engine.stats().cuda_graphs > 0


def test_cuda_graph_replay_equals_eager() -> None:
    model = _gpu_model()
    params = SamplingParams(max_tokens=40, temperature=0.9, top_p=0.95, n=2, seed=5)
    graphed = engine_for(model, ON_GPU, num_kv_blocks=200).generate(PROMPTS, params)
    eager = engine_for(model, ON_GPU, num_kv_blocks=200, cuda_graphs=False).generate(
        PROMPTS, params
    )
    assert [r.token_ids for r in graphed] == [r.token_ids for r in eager]
    for a, b in zip(graphed, eager, strict=True):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)


def test_overlap_equals_sync_on_gpu() -> None:
    model = _gpu_model()
    greedy = SamplingParams(max_tokens=48, temperature=0)
    sync = engine_for(model, ON_GPU, overlap=False).generate(PROMPTS, greedy)
    overlap = engine_for(model, ON_GPU, overlap=True).generate(PROMPTS, greedy)
    assert [r.token_ids for r in sync] == [r.token_ids for r in overlap]


def test_bf16_engine_runs_and_streams() -> None:
    model = _gpu_model()
    engine = engine_for(
        model, ON_GPU, dtype="bfloat16", num_kv_blocks=None, gpu_memory_utilization=0.3
    )
    results = engine.generate(PROMPTS, SamplingParams(max_tokens=64, n=3, seed=1, ignore_eos=True))
    assert all(len(r.token_ids) == 64 and r.finish_reason == "length" for r in results)
    assert all(torch.isfinite(torch.tensor(r.logprobs)).all() for r in results)
    assert engine.stats().free_kv_blocks == engine.num_kv_blocks


def test_compiled_layers_agree_with_eager() -> None:
    model = _gpu_model()
    params = SamplingParams(max_tokens=32, temperature=0)
    eager = engine_for(model, ON_GPU, num_kv_blocks=200).generate(PROMPTS, params)
    engine = engine_for(model, ON_GPU, num_kv_blocks=200, compile_model=True)
    compiled = engine.generate(PROMPTS, params)
    first = [r.token_ids[:8] for r in eager]
    assert [r.token_ids[:8] for r in compiled] == first
    same = sum(
        a == b
        for x, y in zip(eager, compiled, strict=True)
        for a, b in zip(x.token_ids, y.token_ids, strict=True)
    )
    assert same / sum(len(r.token_ids) for r in eager) > 0.95
    # Weight names are untouched by compiling (weight sync goes by name).
    assert not any("_orig_mod" in name for name, _ in engine.model.named_parameters())


def test_triton_linear_agrees_with_cublas_in_a_compiled_bf16_engine() -> None:
    model = _gpu_model().to(torch.bfloat16)
    params = SamplingParams(max_tokens=32, temperature=0)
    settings = dict(dtype="bfloat16", num_kv_blocks=200, compile_model=True)
    cublas = engine_for(model, ON_GPU, triton_linear=False, **settings).generate(PROMPTS, params)
    engine = engine_for(model, ON_GPU, **settings)
    assert hasattr(engine.model.lm_head, "_plain_forward")  # routed through decode_linear
    routed = engine.generate(PROMPTS, params)
    assert [r.token_ids[:2] for r in routed] == [r.token_ids[:2] for r in cublas]
    same = sum(
        a == b
        for x, y in zip(cublas, routed, strict=True)
        for a, b in zip(x.token_ids, y.token_ids, strict=True)
    )
    assert same / sum(len(r.token_ids) for r in cublas) > 0.8  # bf16: rounding may flip a near-tie


@pytest.mark.parametrize("family", ["mistral", "gemma2", "gpt_oss"])
def test_windowed_families_equal_transformers_and_graphs_equal_eager(family: str) -> None:
    """Sliding windows (8 tokens, prompts up to 64), softcap and sinks through the Triton
    kernels: greedy tokens equal transformers' on the GPU in fp32, and graph replay == eager
    (in bf16 for gpt-oss: its fp32 MoE path reads the routing on the host, so it cannot be
    captured, and the engine says so at construction)."""
    from rollout.engine.model.capabilities import UnsupportedModelError
    from tests import model_zoo

    model = model_zoo.tiny_model(family).to("cuda")
    params = SamplingParams(max_tokens=40, temperature=0)
    expected = [model_zoo.hf_greedy(model, p, 40) for p in PROMPTS]
    eager = engine_for(model, ON_GPU, cuda_graphs=False).generate(PROMPTS, params)
    assert [r.token_ids for r in eager] == expected
    graph_dtype = "float32"
    if family == "gpt_oss":
        with pytest.raises(UnsupportedModelError, match="cuda_graphs=False"):
            engine_for(model, ON_GPU)
        model, graph_dtype = model.to(torch.bfloat16), "bfloat16"
    sampled = SamplingParams(max_tokens=40, temperature=1.0, n=2, seed=3)
    settings = dict(num_kv_blocks=200, dtype=graph_dtype)
    graphed = engine_for(model, ON_GPU, **settings)
    a = graphed.generate(PROMPTS, sampled)
    assert graphed.stats().cuda_graphs > 0
    b = engine_for(model, ON_GPU, cuda_graphs=False, **settings).generate(PROMPTS, sampled)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]


@pytest.mark.parametrize("overlap", [False, True])
def test_speculation_on_gpu_emits_the_plain_tokens(overlap: bool) -> None:
    """Verification steps replay their own CUDA graphs beside the decode graphs; greedy and
    sampled tokens equal a run without speculation."""
    model = _gpu_model()
    for params in (
        SamplingParams(max_tokens=40, temperature=0),
        SamplingParams(max_tokens=40, temperature=0.5, n=2, seed=4),
    ):
        plain = engine_for(model, ON_GPU, num_kv_blocks=200, overlap=overlap).generate(
            PROMPTS, params
        )
        engine = engine_for(
            model,
            ON_GPU,
            num_kv_blocks=200,
            overlap=overlap,
            speculative="ngram",
            speculative_max_seqs=16,
        )
        # Try every step (random drafts rarely pass).
        engine.debug_internals().scheduler.speculation.max_pause = 0
        fast = engine.generate(PROMPTS, params)
        assert [r.token_ids for r in fast] == [r.token_ids for r in plain]
        assert engine.stats().speculation.accepted > 0
        # Verification steps replayed graphs of num_speculative_tokens + 1 tokens a sequence.
        graphs = engine.debug_internals().runner.graphs
        assert 5 in graphs.widths(), graphs.widths()
