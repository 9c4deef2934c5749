"""FP8 weights on the GPU: the engine's FP8 decode GEMMs and experts serve the rounded model as
transformers computes it (exactly in fp32; to bf16 precision in bf16), CUDA graphs equal eager,
and a weight update is rounded again in place under captured graphs."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from rollout import SamplingParams
from rollout.kernels import triton_fp8_widen
from rollout.kernels.torch_fp8 import fp8_linear_reference, quantize_rows
from rollout.kernels.torch_moe import fused_experts_reference
from rollout.kernels.torch_paged_attention import v_by_token
from rollout.kernels.triton_attention_tiles import fp8_kv_tiles
from rollout.kernels.triton_fp8_widen import widen_e4m3
from tests import model_zoo
from tests.conftest import engine_for, hf_greedy, random_prompts, tiny_model
from tests.fp8_oracle import rounded_copy, wide_model_with_outliers

pytestmark = pytest.mark.gpu

PROMPTS = random_prompts((1, 5, 16, 17, 33, 50, 64, 9, 2), seed=21)
ON_GPU = dict(
    device="cuda",
    dtype="float32",
    block_size=16,
    max_model_len=256,
    max_num_seqs=16,
    max_num_batched_tokens=48,
    num_kv_blocks=24,  # preemption
    attention="triton",
    compile_model=False,
    weight_quantization="fp8",
)


@pytest.fixture(autouse=True)
def every_decode_gemm_reads_fp8(monkeypatch):
    """The engine reads FP8 only where it pays (wide outputs, few rows: none in these tiny
    models; experts from 8 tokens a step); here every decode GEMM and experts launch does, the
    most demanding case for exactness."""
    from rollout.kernels import triton_linear, triton_moe

    monkeypatch.setattr(triton_linear, "FP8_MIN_COLUMNS", 0)
    monkeypatch.setattr(triton_linear, "FP8_MAX_ROWS", triton_linear.MAX_ROWS)
    monkeypatch.setattr(triton_moe, "FP8_EXPERTS_MIN_TOKENS", 0)


def _count_fp8_launches(monkeypatch) -> list[int]:
    """Counts the decode GEMMs launched over FP8 weights."""
    from rollout.kernels import triton_linear

    launches = []
    launch = triton_linear.launch

    def counting(*args, scale=None, **kwargs):
        if scale is not None:
            launches.append(1)
        return launch(*args, scale=scale, **kwargs)

    monkeypatch.setattr(triton_linear, "launch", counting)
    return launches


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen3_moe"])
def test_fp32_greedy_equals_transformers_on_the_rounded_model(arch: str, monkeypatch) -> None:
    model = tiny_model(arch).to("cuda")
    reference = rounded_copy(model)
    expected = [hf_greedy(reference, p, 40) for p in PROMPTS]
    launches = _count_fp8_launches(monkeypatch)
    engine = engine_for(model, ON_GPU)
    results = engine.generate(PROMPTS, SamplingParams(max_tokens=40, temperature=0))
    assert [r.token_ids for r in results] == expected
    assert launches, "the decode steps must read the FP8 weights"
    assert engine.stats().preemptions > 0 and engine.stats().cuda_graphs > 0


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_bf16_logprobs_are_the_rounded_models_to_bf16_precision(arch: str) -> None:
    model = tiny_model(arch).to("cuda", torch.bfloat16)
    reference = rounded_copy(model)
    engine = engine_for(model, ON_GPU, dtype="bfloat16", num_kv_blocks=200, compile_model=True)
    params = SamplingParams(max_tokens=40, temperature=1.0, seed=2)
    diffs = logprob_differences(reference, PROMPTS, engine.generate(PROMPTS, params))
    assert diffs.median() < 0.02 and diffs.max() < 0.25, (diffs.median(), diffs.max())


def logprob_differences(reference, prompts: list[list[int]], results) -> torch.Tensor:
    """|engine logprob - reference logprob| of every sampled token; `results` in prompt order,
    each prompt's samples in turn."""
    device = next(reference.parameters()).device
    per_prompt = len(results) // len(prompts)
    diffs = []
    for i, result in enumerate(results):
        prompt = prompts[i // per_prompt]
        ids = torch.tensor([prompt + result.token_ids], device=device)
        with torch.no_grad():
            logits = reference(ids).logits[0, len(prompt) - 1 : -1].float()
        want = torch.log_softmax(logits, -1).gather(1, ids[0, len(prompt) :, None])[:, 0]
        diffs.append((torch.tensor(result.logprobs, device=device) - want).abs())
    return torch.cat(diffs)


@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
@pytest.mark.parametrize("compile_model", [False, True])
def test_graphs_equal_eager_with_fp8_weights(arch: str, compile_model: bool) -> None:
    model = model_zoo.tiny_model(arch).to("cuda", torch.bfloat16)
    sampled = SamplingParams(max_tokens=40, temperature=1.0, n=2, seed=3)
    settings = dict(num_kv_blocks=200, dtype="bfloat16", compile_model=compile_model)
    graphed = engine_for(model, ON_GPU, **settings)
    a = graphed.generate(PROMPTS, sampled)
    assert graphed.stats().cuda_graphs > 0
    b = engine_for(model, ON_GPU, cuda_graphs=False, **settings).generate(PROMPTS, sampled)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]


@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
def test_a_weight_update_under_captured_graphs_is_rounded_in_place(arch: str) -> None:
    old, new = (tiny_model(arch, seed=s).to("cuda", torch.bfloat16) for s in (1, 2))
    settings = dict(num_kv_blocks=200, dtype="bfloat16")
    params = SamplingParams(max_tokens=32, temperature=1.0, n=2, seed=5)
    engine = engine_for(old, ON_GPU, **settings)
    engine.generate(PROMPTS, params)  # captures the graphs on the old weights
    graphs = engine.stats().cuda_graphs
    engine.update_weights(list(new.named_parameters()))
    assert engine.stats().fp8_round_s is not None
    after = engine.generate(PROMPTS, params)
    fresh = engine_for(new, ON_GPU, **settings).generate(PROMPTS, params)
    assert engine.stats().cuda_graphs == graphs  # replayed, not captured again
    assert [r.token_ids for r in after] == [r.token_ids for r in fresh]


def test_speculation_with_fp8_weights_emits_the_plain_tokens() -> None:
    model = tiny_model("llama").to("cuda")
    for params in (
        SamplingParams(max_tokens=40, temperature=0),
        SamplingParams(max_tokens=40, temperature=0.5, n=2, seed=4),
    ):
        plain = engine_for(model, ON_GPU, num_kv_blocks=200).generate(PROMPTS, params)
        engine = engine_for(
            model, ON_GPU, num_kv_blocks=200, speculative="ngram", speculative_max_seqs=16
        )
        engine.debug_internals().scheduler.speculation.max_pause = 0  # try every step
        drafted = engine.generate(PROMPTS, params)
        assert [r.token_ids for r in drafted] == [r.token_ids for r in plain]
        assert engine.stats().speculation.verifications > 0


@pytest.mark.parametrize("tokens", [1, 32, 2000])
def test_fp8_experts_kernel_equals_its_twin(tokens: int, monkeypatch) -> None:
    from rollout.kernels.triton_moe import fused_experts

    g = torch.Generator(device="cuda").manual_seed(tokens)
    experts, top_k, hidden, inter = 128, 8, 512, 192
    x = torch.randn(tokens, hidden, generator=g, device="cuda").bfloat16()
    weights, index = torch.softmax(
        torch.randn(tokens, experts, generator=g, device="cuda"), -1
    ).topk(top_k, dim=-1)
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=g, device="cuda") / 20
    down = torch.randn(experts, hidden, inter, generator=g, device="cuda") / 12
    (gq, gs), (dq, ds) = quantize_rows(gate_up), quantize_rows(down)
    got = fused_experts(x, index, weights, gq, dq, gs, ds)
    rounded = [(q.float() * s[..., None]).bfloat16() for q, s in ((gq, gs), (dq, ds))]
    want = fused_experts_reference(x, index, weights, *rounded)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    # the engine's entry point: FP8 from FP8_EXPERTS_MIN_TOKENS tokens, bf16 below, same values
    from rollout.kernels import triton_moe

    for threshold in (0, tokens + 1):
        monkeypatch.setattr(triton_moe, "FP8_EXPERTS_MIN_TOKENS", threshold)
        chosen = triton_moe.fused_experts_fp8(x, index, weights, *rounded, gq, gs, dq, ds)
        torch.testing.assert_close(chosen, want, rtol=2e-2, atol=2e-2)


def test_fp32_fp8_decode_gemm_is_the_rounded_gemm() -> None:
    from rollout.kernels.torch_fp8 import FP8_DTYPE, round_to_fp8_
    from rollout.kernels.triton_linear import decode_linear

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(33, 700, device="cuda", generator=g)
    weight = torch.randn(300, 700, device="cuda", generator=g)
    q, scale = (
        torch.empty(300, 700, device="cuda", dtype=FP8_DTYPE),
        torch.empty(300, device="cuda"),
    )
    round_to_fp8_(weight, q, scale)
    got = decode_linear(x, weight, None, q, scale)
    torch.testing.assert_close(got, fp8_linear_reference(x, q, scale), rtol=1e-5, atol=1e-4)


# ---- the FP8 KV cache ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_kv_write_and_reads_equal_the_twin(dtype) -> None:
    from rollout.kernels import torch_paged_attention as twin
    from rollout.kernels import triton_paged_attention as kernels
    from rollout.kernels.torch_fp8 import FP8_DTYPE
    from tests.kernel_cases import make_case, with_fp8_cache

    g = torch.Generator(device="cuda").manual_seed(0)
    key = torch.randn(40, 8, 128, device="cuda", generator=g).to(dtype) * 30
    value = torch.randn(40, 8, 128, device="cuda", generator=g).to(dtype)
    slots = torch.randperm(64, device="cuda")[:40].to(torch.int64)
    caches = [torch.zeros(4, 16, 8, 128, device="cuda", dtype=FP8_DTYPE) for _ in range(4)]
    scales = [torch.ones(4, 16, 8, device="cuda") for _ in range(4)]
    kernels.write_kv(key, value, caches[0], caches[1], slots, scales[0], scales[1])
    twin.write_kv(key, value, caches[2], caches[3], slots, scales[2], scales[3])
    for a, b in ((0, 2), (1, 3)):
        assert torch.equal(caches[a].view(torch.uint8), caches[b].view(torch.uint8))
        assert torch.equal(scales[a], scales[b])
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    decode = with_fp8_cache(make_case([1, 700, 4000, 129], [1] * 4, 8, 4, 128, 16, dtype, "cuda"))
    got = kernels.decode_attention(
        decode["query"], decode["k_cache"], decode["v_cache"], decode["block_tables"],
        decode["seq_lens"], decode["scale"], 4096, kv_scales=decode["kv_scales"],
    )  # fmt: skip
    want = twin.paged_attention(
        decode["query"], decode["k_cache"], decode["v_cache"], decode["block_tables"],
        decode["query_start_loc_host"], decode["seq_lens_host"], decode["scale"],
        kv_scales=decode["kv_scales"],
    )  # fmt: skip
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    extend = with_fp8_cache(make_case([300, 70, 5], [300, 7, 1], 8, 4, 128, 16, dtype, "cuda"))
    got = kernels.extend_attention(
        extend["query"], extend["k_cache"], extend["v_cache"], extend["block_tables"],
        extend["query_start_loc"], extend["seq_lens"], extend["q_block_seq"],
        extend["q_block_start"], extend["scale"], kv_scales=extend["kv_scales"],
    )  # fmt: skip
    want = twin.paged_attention(
        extend["query"], extend["k_cache"], extend["v_cache"], extend["block_tables"],
        extend["query_start_loc_host"], extend["seq_lens_host"], extend["scale"],
        kv_scales=extend["kv_scales"],
    )  # fmt: skip
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


# Pages of 16 tokens, and an FP8 cache's default (block_size None: 32) in few enough blocks that
# these prompts preempt (12 of 32 tokens admit too few sequences at once to run out; the
# scheduler's choices are the device's alike: 10 preempt twice on CPU, as 24 of 16 do)
PAGES = pytest.mark.parametrize(("block_size", "num_kv_blocks"), [(16, 24), (None, 10)])


@PAGES
@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
def test_fp32_greedy_with_an_fp8_kv_cache_equals_transformers(
    arch: str, block_size: int | None, num_kv_blocks: int
) -> None:
    from tests.fp8_oracle import with_fp8_kv_attention

    model = tiny_model(arch).to("cuda")
    reference = with_fp8_kv_attention(model)
    expected = [hf_greedy(reference, p, 40) for p in PROMPTS]
    engine = engine_for(
        model, ON_GPU, weight_quantization="none", kv_cache_dtype="fp8",
        block_size=block_size, num_kv_blocks=num_kv_blocks,
    )  # fmt: skip
    assert engine.config.block_size == (block_size or 32)
    results = engine.generate(PROMPTS, SamplingParams(max_tokens=40, temperature=0))
    assert [r.token_ids for r in results] == expected
    assert engine.stats().preemptions > 0 and engine.stats().cuda_graphs > 0


@pytest.mark.parametrize("compile_model", [False, True])
def test_graphs_equal_eager_with_fp8_weights_and_kv(compile_model: bool) -> None:
    model = tiny_model("qwen3").to("cuda", torch.bfloat16)
    sampled = SamplingParams(max_tokens=40, temperature=1.0, n=2, seed=3)
    settings = dict(
        num_kv_blocks=200, dtype="bfloat16", compile_model=compile_model, kv_cache_dtype="fp8"
    )
    graphed = engine_for(model, ON_GPU, **settings)
    a = graphed.generate(PROMPTS, sampled)
    assert graphed.stats().cuda_graphs > 0
    b = engine_for(model, ON_GPU, cuda_graphs=False, **settings).generate(PROMPTS, sampled)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]


@pytest.mark.parametrize("block_size", [16, None, 64])
def test_graphs_equal_eager_at_the_full_batch_tiles_of_an_fp8_cache(
    monkeypatch, block_size: int | None
) -> None:
    """Every decode launch taken as a full batch (a target of 2 programs): the crowded FP8
    launches' one-warp programs of 32-token tiles, graphed and eager alike, over pages of 16
    tokens (two a tile), of the FP8 cache's default 32 (one a tile) and of 64 (two tiles a
    page)."""
    import dataclasses

    from rollout.kernels import triton_decode_attention as decode

    full = dataclasses.replace(decode.DECODE_TILES, target_programs=2)
    monkeypatch.setattr(decode, "DECODE_TILES", full)
    shapes = []
    tile_shape = decode.DecodeTiles.tile_shape

    def recording(self, *args):
        shapes.append(tile_shape(self, *args))
        return shapes[-1]

    monkeypatch.setattr(decode.DecodeTiles, "tile_shape", recording)
    model = tiny_model("qwen3").to("cuda", torch.bfloat16)
    sampled = SamplingParams(max_tokens=40, temperature=1.0, n=2, seed=3)
    settings = dict(
        num_kv_blocks=200, dtype="bfloat16", kv_cache_dtype="fp8", block_size=block_size
    )
    graphed = engine_for(model, ON_GPU, **settings)
    a = graphed.generate(PROMPTS, sampled)
    assert graphed.stats().cuda_graphs > 0
    b = engine_for(model, ON_GPU, cuda_graphs=False, **settings).generate(PROMPTS, sampled)
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert (32, 1) in shapes


# ---- widening e4m3 to bf16 (triton_fp8_widen) ---------------------------------------------------


@triton.jit
def _widen_kernel(
    x_ptr, y_ptr, FAST: tl.constexpr, WHERE_LOADED: tl.constexpr, ROWS: tl.constexpr,
    COLS: tl.constexpr,
):  # fmt: skip
    offs = tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :]
    dtype = y_ptr.dtype.element_ty
    tl.store(y_ptr + offs, widen_e4m3(tl.load(x_ptr + offs), dtype, FAST, WHERE_LOADED))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("where_loaded", [True, False])
def test_the_fast_widening_is_the_cast_for_every_e4m3_value(where_loaded: bool, dtype) -> None:
    """bf16 by integer ops, fp16 by the conversion instruction, both placements."""
    from rollout.kernels.torch_fp8 import FP8_DTYPE

    # every byte once, then random bytes: the tile's per-thread packing of four values
    codes = torch.cat([torch.arange(256), torch.randint(0, 256, (64 * 128 - 256,))])
    x = codes.to(torch.uint8).cuda().view(FP8_DTYPE)
    got = torch.empty(64 * 128, device="cuda", dtype=dtype)
    _widen_kernel[(1,)](x, got, FAST=True, WHERE_LOADED=where_loaded, ROWS=64, COLS=128)
    want = x.to(dtype)
    nan = want.isnan()
    assert torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))  # -0 too
    if dtype == torch.float16:
        assert got[nan].isnan().all()
    else:
        # e4m3's NaN (0x7F, 0xFF) reads as +-480, which weights never hold (refused when rounded)
        assert set(got[nan].float().abs().tolist()) == {480.0}


def _by_cast(run):
    before = triton_fp8_widen.FAST_WIDEN
    triton_fp8_widen.FAST_WIDEN = False
    try:
        return run()
    finally:
        triton_fp8_widen.FAST_WIDEN = before


def test_fp8_kernels_give_the_same_bits_widening_either_way() -> None:
    """The decode GEMM, the experts and both attention kernels, bf16: the integer widening and
    Triton's cast feed the same values to the same sums."""
    from rollout.kernels import triton_linear
    from rollout.kernels import triton_paged_attention as kernels
    from rollout.kernels.triton_moe import fused_experts
    from tests.kernel_cases import make_case, with_fp8_cache

    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(32, 4096, generator=g, device="cuda").bfloat16()
    q, scale = quantize_rows(torch.randn(6144, 4096, generator=g, device="cuda") / 30)
    y = torch.empty(32, 6144, device="cuda", dtype=torch.bfloat16)
    differ = []  # every kernel checked, so one GPU run says which differ
    for rows in (8, 32):  # the K split in two, and wider tiles
        tiles = triton_linear._tiles(rows, 6144, 1)
        triton_linear.launch(x[:rows], q, None, y[:rows], *tiles, scale=scale)
        fast = y[:rows].clone()
        _by_cast(
            lambda t=tiles, r=rows: triton_linear.launch(x[:r], q, None, y[:r], *t, scale=scale)
        )
        if not torch.equal(fast, y[:rows]):
            differ.append(f"decode GEMM at {rows} rows")
    tokens, experts, hidden, inter = 40, 16, 512, 192
    h = torch.randn(tokens, hidden, generator=g, device="cuda").bfloat16()
    weights, index = torch.softmax(
        torch.randn(tokens, experts, generator=g, device="cuda"), -1
    ).topk(4, dim=-1)
    (gq, gs), (dq, ds) = (
        quantize_rows(torch.randn(experts, 2 * inter, hidden, generator=g, device="cuda") / 20),
        quantize_rows(torch.randn(experts, hidden, inter, generator=g, device="cuda") / 12),
    )
    fast = fused_experts(h, index, weights, gq, dq, gs, ds)
    if not torch.equal(fast, _by_cast(lambda: fused_experts(h, index, weights, gq, dq, gs, ds))):
        differ.append("experts")
    decode = with_fp8_cache(
        make_case([1, 700, 4000, 129], [1] * 4, 8, 4, 128, 16, torch.bfloat16, "cuda")
    )
    extend = with_fp8_cache(
        make_case([300, 70, 5], [300, 7, 1], 8, 4, 128, 16, torch.bfloat16, "cuda")
    )

    def read_decode():
        return kernels.decode_attention(
            decode["query"], decode["k_cache"], decode["v_cache"], decode["block_tables"],
            decode["seq_lens"], decode["scale"], 4096, kv_scales=decode["kv_scales"],
        )  # fmt: skip

    def read_extend():
        return kernels.extend_attention(
            extend["query"], extend["k_cache"], extend["v_cache"], extend["block_tables"],
            extend["query_start_loc"], extend["seq_lens"], extend["q_block_seq"],
            extend["q_block_start"], extend["scale"], kv_scales=extend["kv_scales"],
        )  # fmt: skip

    for read in (read_decode, read_extend):
        if not torch.equal(read(), _by_cast(read)):
            differ.append(read.__name__)
        with fp8_kv_tiles("bf16"):  # the default widens K to fp16: V's path alone too
            if not torch.equal(read(), _by_cast(read)):
                differ.append(f"{read.__name__}, bf16 tiles")
    assert not differ


@pytest.mark.parametrize(
    "tiles",
    [
        {},
        dict(num_warps=2),
        dict(num_warps=8, num_stages=2),
        dict(fp8_full_batch_split_len=1024),
        dict(fp8_keys_wide=False),
        dict(target_programs=8),
        dict(target_programs=8, fp8_full_batch_split_len=512),
        dict(target_programs=8, fp8_full_batch_block_n=0),
        dict(target_programs=8, fp8_one_warp_target_programs=64),
        dict(target_programs=8, fp8_one_warp_max_registers=128),
        dict(target_programs=8, fp8_one_warp_num_stages=5),
        dict(target_programs=8, fp8_one_warp_num_stages=7),
        dict(target_programs=8, fp8_one_warp_merge_pairs=16),
        dict(target_programs=8, fp8_one_warp_merge_pairs=8, fp8_one_warp_target_programs=64),
    ],
    ids=[
        "default",
        "2w",
        "8w",
        "1024",
        "rows-wide",
        "full-1w",
        "full-1w-merged",
        "full-4w",
        "1w-more-programs",
        "1w-128-registers",
        "1w-5-stages",
        "1w-7-stages",
        "1w-merge-16",
        "1w-merge-8-more-programs",
    ],
)
@pytest.mark.parametrize("choice", ["fp16 K", "bf16"])
def test_an_fp8_cache_is_read_within_bf16s_rounding(choice: str, tiles) -> None:
    """Decode (at the launch choices bench_attention.py times) and extend, bf16 queries over an
    FP8 cache, K through fp16 tiles or bf16 ones: within one bf16 unit of the fp32 twin's result
    plus bf16's rounding of the probabilities (2^-8 of the same sum over |values|), with query
    rows from 1e-4 to 1e6 (past fp16's range) and a KV head of values near 1e-7."""
    import dataclasses

    from rollout.kernels import triton_paged_attention as kernels
    from tests.kernel_cases import attend, fp8_attention_error_bound, wide_range_fp8_case

    for seq_lens, query_lens in (([1, 700, 4000, 129], [1] * 4), ([300, 70, 5], [300, 7, 1])):
        case = wide_range_fp8_case(seq_lens, query_lens, 8, 128, "cuda")
        with fp8_kv_tiles(choice):
            launch = dataclasses.replace(kernels.DECODE_TILES, **tiles)
            got = attend(case, case["query_bf16"], 4096, launch)
        want, bound = fp8_attention_error_bound(case, 2**-8)
        assert not got.isnan().any()
        assert ((got.float() - want).abs() <= bound).all()


@pytest.mark.parametrize("page", [16, 32, 64, 128])
@pytest.mark.parametrize("group, query_len", [(4, 1), (2, 1), (8, 1), (4, 3)])
def test_the_decode_kernel_reads_an_fp8_cache_at_the_engines_tiles(group, query_len, page) -> None:
    """The engine's launches at head_dim 128 and its default tiles, bf16: the keys-wide tiles
    (up to 4 query rows a KV head) and the rows-wide ones past that (8 rows; 12 for a prompt
    of 3 tokens or a verification step), against the twin; then the same batch as a crowded
    launch (the one-warp tiles where keys-wide); pages of 16 and 32 tokens (whole pages a
    tile), 64 and 128 (a one-warp tile within a page)."""
    import dataclasses

    from rollout.kernels import torch_paged_attention as twin
    from rollout.kernels import triton_paged_attention as kernels
    from tests.kernel_cases import make_case, with_fp8_cache

    lens = [3, 700, 4000, 129]
    case = with_fp8_cache(
        make_case(lens, [query_len] * 4, 8, group, 128, page, torch.bfloat16, "cuda", seed=group)
    )
    kv = (case["query"], case["k_cache"], case["v_cache"], case["block_tables"])
    want = twin.paged_attention(
        *kv, case["query_start_loc_host"], case["seq_lens_host"], case["scale"],
        kv_scales=case["kv_scales"],
    )  # fmt: skip
    crowded = dataclasses.replace(kernels.DECODE_TILES, target_programs=8)
    for tiles in (None, crowded):
        got = kernels.decode_attention(
            *kv, case["seq_lens"], case["scale"], 4096, tiles, query_len=query_len,
            kv_scales=case["kv_scales"],
        )  # fmt: skip
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("kv_tiles", ["bf16", "fp16 K"])
def test_graphs_equal_eager_with_an_fp8_kv_cache_read_through(kv_tiles: str) -> None:
    with fp8_kv_tiles(kv_tiles):
        model = tiny_model("qwen3").to("cuda", torch.bfloat16)
        sampled = SamplingParams(max_tokens=40, temperature=1.0, n=2, seed=3)
        settings = dict(
            num_kv_blocks=200, dtype="bfloat16", weight_quantization="none", kv_cache_dtype="fp8"
        )
        graphed = engine_for(model, ON_GPU, **settings)
        a = graphed.generate(PROMPTS, sampled)
        assert graphed.stats().cuda_graphs > 0
        b = engine_for(model, ON_GPU, cuda_graphs=False, **settings).generate(PROMPTS, sampled)
        assert [r.token_ids for r in a] == [r.token_ids for r in b]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_v_laid_out_by_token_reads_the_same(dtype) -> None:
    """An FP8 cache whose V pages hold each (head, dim)'s tokens side by side (the engine's) and
    one laid out by dim: decode and extend give the same result within the probabilities'
    rounding, and NaN bytes left past every context (another sequence's leftovers, which V by
    token reads unmasked) reach neither."""
    from rollout.kernels import triton_paged_attention as kernels
    from tests.kernel_cases import make_case, with_fp8_cache, with_nan_leftovers

    outs = {}
    for by_token in (False, True):
        for name, seq_lens, query_lens in (
            ("decode", [1, 37, 700, 4000, 129], [1] * 5),
            ("extend", [300, 70, 5], [300, 7, 1]),
        ):
            case = make_case(seq_lens, query_lens, 8, 4, 128, 16, dtype, "cuda")
            case = with_nan_leftovers(with_fp8_cache(case, by_token))
            kv = (case["query"], case["k_cache"], case["v_cache"], case["block_tables"])
            if name == "decode":
                got = kernels.decode_attention(
                    *kv, case["seq_lens"], case["scale"], 4096, kv_scales=case["kv_scales"]
                )
            else:
                got = kernels.extend_attention(
                    *kv, case["query_start_loc"], case["seq_lens"], case["q_block_seq"],
                    case["q_block_start"], case["scale"], kv_scales=case["kv_scales"],
                )  # fmt: skip
            assert torch.isfinite(got).all(), (name, by_token)
            outs[name, by_token] = got.float()
    for name in ("decode", "extend"):
        torch.testing.assert_close(outs[name, True], outs[name, False], rtol=2e-3, atol=2e-3)
    case = make_case([40], [1], 8, 4, 128, 16, dtype, "cuda")
    with pytest.raises(ValueError, match="needs an FP8 cache"):
        kernels.decode_attention(
            case["query"], case["k_cache"], v_by_token(case["v_cache"]), case["block_tables"],
            case["seq_lens"], case["scale"], 4096,
        )  # fmt: skip


ROUNDED_INPUTS = dict(activation_quantization="fp8", fp8_lm_head=True)


@pytest.mark.parametrize("rows", [1, 16, 40, 128])
@pytest.mark.parametrize("n", [4096, 1000])
@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_rounded_norm_matches_its_twin_in_bf16(rows: int, n: int, grouped: bool, residual: bool):
    """The rounding RMSNorm's ops on the GPU against their twin: the sum exactly; the norm's
    own fp32 sums and rsqrt may move a bf16 rounding, and then a value by an e4m3 step, in a few
    elements; the FP8 form is always what the rounded rows stand for."""
    from rollout.kernels import triton_rounded_rows  # noqa: F401 - registers the ops
    from rollout.kernels.torch_fp8 import dequantize_groups, dequantize_rows
    from rollout.kernels.torch_rounded_rows import rms_norm_rounded

    g = torch.Generator(device="cuda").manual_seed(rows + n)
    x = torch.randn(2, rows, n, device="cuda", generator=g).bfloat16()
    x[0, 0, : n // 8] *= 100  # outliers in the first groups of a row
    r = torch.randn(2, rows, n, device="cuda", generator=g).bfloat16() if residual else None
    weight = (1 + torch.randn(n, device="cuda", generator=g) / 4).bfloat16()
    if residual:
        h, y, q, scale = torch.ops.rollout.add_rms_norm_rounded(x, r, weight, 1e-6, grouped)
    else:
        y, q, scale = torch.ops.rollout.rms_norm_rounded(x, weight, 1e-6, grouped)
    want_h, want_y, _, _ = rms_norm_rounded(x, weight, 1e-6, grouped, r)
    if residual:
        assert torch.equal(h, want_h)
    dequantize = dequantize_groups if grouped else dequantize_rows
    assert torch.equal(dequantize(q, scale, torch.bfloat16), y)
    assert scale.shape == ((2, rows, -(-n // 128)) if grouped else (2, rows))
    same = (y == want_y).float().mean().item()
    assert same > 0.999, same
    step = want_y.float().abs() / 8 + scale.max() * 2.0**-9  # an e4m3 step, subnormals included
    assert ((y.float() - want_y.float()).abs() <= step).all()


@pytest.mark.parametrize("rows", [1, 40, 300])
@pytest.mark.parametrize("grouped", [False, True])
def test_round_rows_is_its_twin_exactly(rows: int, grouped: bool) -> None:
    """The rounding alone (o's input under FP8 activations) has no arithmetic of its own before
    it: the same bits as the twin."""
    from rollout.kernels import triton_rounded_rows  # noqa: F401 - registers the op
    from rollout.kernels.torch_rounded_rows import rounded

    g = torch.Generator(device="cuda").manual_seed(rows)
    x = torch.randn(rows, 4096, device="cuda", generator=g).bfloat16()
    x[0, :512] *= 1000
    for got, want in zip(
        torch.ops.rollout.round_rows(x, grouped), rounded(x, grouped), strict=True
    ):
        assert torch.equal(got.float(), want.float())


@pytest.mark.parametrize("rows", [1, 40, 300])
@pytest.mark.parametrize("grouped", [False, True])
def test_the_rounding_kernels_without_rows_store_the_same_fp8_form(rows: int, grouped: bool):
    """`with_rows=False`, as decode's FP8-MMA GEMMs ask (they read only the e4m3 bytes and
    scales): no rows in the activations' dtype (y [..., 0]), the same bytes, scales and sum."""
    from rollout.kernels import triton_rounded_rows  # noqa: F401 - registers the ops

    g = torch.Generator(device="cuda").manual_seed(rows)
    x, r = torch.randn(2, rows, 4096, device="cuda", generator=g).bfloat16()
    x[0, :512] *= 1000
    weight = (1 + torch.randn(4096, device="cuda", generator=g) / 4).bfloat16()
    gate_up = torch.randn(rows, 2 * 12288, device="cuda", generator=g).bfloat16() * 3
    ops = torch.ops.rollout
    for function, args in [
        (ops.rms_norm_rounded, (x, weight, 1e-6, grouped)),
        (ops.add_rms_norm_rounded, (x, r, weight, 1e-6, grouped)),
        (ops.silu_mul_rounded, (gate_up, grouped)),
        (ops.round_rows, (x, grouped)),
    ]:
        *h, y, q, scale = function(*args)
        *bare_h, bare_y, bare_q, bare_scale = function(*args, False)
        assert bare_y.shape == (*y.shape[:-1], 0)
        assert torch.equal(bare_q.view(torch.uint8), q.view(torch.uint8))
        assert torch.equal(bare_scale, scale)
        assert all(torch.equal(a, b) for a, b in zip(bare_h, h, strict=True))


@pytest.mark.parametrize("rows", [1, 16, 40, 128])
@pytest.mark.parametrize("n", [12288, 1000])
@pytest.mark.parametrize("grouped", [False, True])
def test_rounded_silu_mul_matches_its_twin_in_bf16(rows: int, n: int, grouped: bool) -> None:
    """The rounding activation's op on the GPU against its twin: its exp may move a bf16
    rounding, and then a value by an e4m3 step, in a few elements."""
    from rollout.kernels import triton_rounded_rows  # noqa: F401 - registers the op
    from rollout.kernels.torch_fp8 import dequantize_groups, dequantize_rows
    from rollout.kernels.torch_rounded_rows import silu_mul_rounded

    g = torch.Generator(device="cuda").manual_seed(rows + n)
    gate_up = (torch.randn(rows, 2 * n, device="cuda", generator=g) * 3).bfloat16()
    gate_up[0, n : n + n // 8] *= 100
    y, q, scale = torch.ops.rollout.silu_mul_rounded(gate_up, grouped)
    want, _, _ = silu_mul_rounded(gate_up, grouped)
    dequantize = dequantize_groups if grouped else dequantize_rows
    assert torch.equal(dequantize(q, scale, torch.bfloat16), y)
    same = (y == want).float().mean().item()
    assert same > 0.999, same
    step = want.float().abs() / 8 + scale.max() * 2.0**-9
    assert ((y.float() - want.float()).abs() <= step).all()


@pytest.mark.parametrize("rows", [1, 2, 8, 17, 32, 33, 64])
def test_gate_up_with_the_activation_in_its_gemm_is_the_unfused_ops(rows: int) -> None:
    """`rollout::gate_up_silu_rounded` at Qwen3-8B's MLP (4,096 in, 2 x 12,288 out), one row
    far above the rest: the FP8 form exactly torch's rounding of the product the GEMM stored;
    that product the unfused W8A8 GEMM's silu(gate) * up to bf16 precision (the exp may move a
    bf16 rounding); that FP8 form the unfused ops' but for an e4m3 step in a few values; and the
    op's, the launches' up to MAX_ROWS rows, the unfused ops' above."""
    from rollout.kernels import triton_gate_up_silu
    from rollout.kernels.torch_fp8 import dequantize_rows

    g = torch.Generator(device="cuda").manual_seed(rows)
    x = torch.randn(rows, 4096, device="cuda", generator=g).bfloat16()
    x[0] *= 50
    q, scale = quantize_rows(torch.randn(2 * 12288, 4096, device="cuda", generator=g) * 0.02)
    weight = (q.float() * scale[:, None]).bfloat16()  # the values the FP8 form stands for
    x8, x_scale = quantize_rows(x)
    y, y8, y_scale = triton_gate_up_silu.launch(x8, x_scale, q, scale, torch.bfloat16)
    want_q, want_scale = quantize_rows(y)
    assert torch.equal(y8.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(y_scale, want_scale)
    unfused = torch.ops.rollout.w8a8_linear(x8, x_scale, weight, None, q, scale)
    gate, up = unfused.float().chunk(2, -1)
    silu = (gate / (1 + torch.exp(-gate))).bfloat16().float()
    product = (silu * up).bfloat16().float()
    assert ((y.float() - product).abs() <= product.abs() / 64 + 1e-6).all()
    _, unfused_q, unfused_scale = torch.ops.rollout.silu_mul_rounded(unfused, False, False)
    op_q, op_scale = torch.ops.rollout.gate_up_silu_rounded(x8, x_scale, weight, q, scale)
    if rows <= triton_gate_up_silu.MAX_ROWS:  # the op: these launches, the unfused ops above
        want_q, want_scale = y8, y_scale
    else:
        want_q, want_scale = unfused_q, unfused_scale
    assert torch.equal(op_q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(op_scale, want_scale)
    ours = dequantize_rows(y8, y_scale, torch.float32)
    theirs = dequantize_rows(unfused_q, unfused_scale, torch.float32)
    assert (ours == theirs).float().mean().item() > 0.99
    assert ((ours - theirs).abs() <= theirs.abs() / 8 + unfused_scale[:, None] * 2.0**-9).all()


def _e4m3_edges(n: int, dtype: torch.dtype) -> torch.Tensor:
    """A row of n whose amax is 448 (its scale is 1): every finite e4m3 value, each midpoint
    between neighbours (a tie, to even) and the values just either side of it, subnormals and
    zeros of both signs, then random values of the same range; exact in fp32, rounded to the
    nearest bf16 otherwise."""
    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    values = values[values.isfinite()].unique()
    mid = (values[1:] + values[:-1]) / 2
    edges = torch.cat([values, mid, mid.nextafter(values[1:]), mid.nextafter(values[:-1])])
    edges = torch.cat([edges, torch.tensor([-0.0, 448.0])])[:n]
    rest = (torch.rand(n - edges.numel()) * 2 - 1) * 448
    return torch.cat([edges, rest]).to(dtype).cuda()


@pytest.mark.parametrize("op", ["norm", "norm_residual", "silu_mul", "round"])
@pytest.mark.parametrize("n", [1000, 4096, 12288])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("grouped", [False, True])
def test_the_gpus_e4m3_conversion_rounds_as_the_bit_arithmetic(op, n, dtype, grouped) -> None:
    """The rounding kernels with the conversion instruction (`HW_E4M3`) against the same kernels
    rounding by `e4m3_bits`: the same bytes, rounded values and scales, at the engine's widths
    (4, 8 and 32 warps), rows of e4m3's edges among them. The bit arithmetic is its twin's
    (test_round_rows_is_its_twin_exactly)."""
    from rollout.kernels import triton_rounded_rows as kernels

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("no e4m3 conversion instruction before compute capability 8.9")
    g = torch.Generator(device="cuda").manual_seed(n)
    width = 2 * n if op == "silu_mul" else n
    x = (torch.randn(5, width, device="cuda", generator=g) * 3).to(dtype)
    x[1, : n // 8] *= 1000  # outliers in a row's first groups
    x[2, :n] = _e4m3_edges(n, dtype)
    x[3, :n] *= 2.0**-100  # scales far from 1
    x[4] = 0  # an all-zero row: scale 1
    weight = (1 + torch.randn(n, device="cuda", generator=g) / 4).to(dtype)
    residual = torch.randn(5, n, device="cuda", generator=g).to(dtype)

    def launch(hw: bool):
        if op == "round":
            return kernels.launch_round(x, grouped, hw=hw)
        if op == "silu_mul":
            return kernels.launch_silu_mul(x, grouped, hw=hw)
        r = residual if op == "norm_residual" else None
        return kernels.launch_norm(x, weight, 1e-6, grouped, r, hw=hw)[1:]

    y, q, scale = launch(True)
    want_y, want_q, want_scale = launch(False)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(scale, want_scale)
    assert torch.equal(y.view(torch.uint8), want_y.view(torch.uint8))
    if op == "round" and not grouped:
        assert torch.equal(q[2, :n].float(), x[2, :n].float().to(torch.float8_e4m3fn).float())


def _count_w8a8_launches(monkeypatch) -> dict[str, int]:
    """Counts the decode GEMMs launched over FP8 weights alone and over FP8 activations too."""
    from rollout.kernels import triton_linear

    counts = {"fp8_weights": 0, "fp8_activations": 0}
    launch = triton_linear.launch

    def counting(*args, scale=None, x_scale=None, **kwargs):
        if scale is not None:
            counts["fp8_activations" if x_scale is not None else "fp8_weights"] += 1
        return launch(*args, scale=scale, x_scale=x_scale, **kwargs)

    monkeypatch.setattr(triton_linear, "launch", counting)
    return counts


def _count_fused_activations(monkeypatch) -> list[int]:
    """Notes each launch of gate/up with the activation in its GEMM (triton_gate_up_silu)."""
    from rollout.kernels import triton_gate_up_silu

    launches = []
    launch = triton_gate_up_silu.launch

    def counting(*args, **kwargs):
        launches.append(1)
        return launch(*args, **kwargs)

    monkeypatch.setattr(triton_gate_up_silu, "launch", counting)
    return launches


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_fp32_greedy_with_rounded_inputs_equals_transformers(arch: str, monkeypatch) -> None:
    model = tiny_model(arch).to("cuda")
    reference = rounded_copy(model, lm_head=True, input_scales="row")
    expected = [hf_greedy(reference, p, 40) for p in PROMPTS]
    counts = _count_w8a8_launches(monkeypatch)
    engine = engine_for(model, ON_GPU, **ROUNDED_INPUTS)
    results = engine.generate(PROMPTS, SamplingParams(max_tokens=40, temperature=0))
    assert [r.token_ids for r in results] == expected
    # fp32: the rounded rows through the FP8-weight kernel (the FP8 MMA is for bf16 and fp16)
    assert counts["fp8_weights"] and not counts["fp8_activations"]
    assert engine.stats().preemptions > 0 and engine.stats().cuda_graphs > 0


def test_fp32_greedy_with_group_rounded_inputs_equals_transformers(monkeypatch) -> None:
    """activation_quantization="fp8-group" on a model whose inputs span several 128-wide groups,
    one of them far above the rest: the group-rounded model's greedy tokens."""
    model = wide_model_with_outliers(seed=3).to("cuda")
    reference = rounded_copy(model, lm_head=True, input_scales="group")
    expected = [hf_greedy(reference, p, 40) for p in PROMPTS]
    counts = _count_w8a8_launches(monkeypatch)
    engine = engine_for(model, ON_GPU, **{**ROUNDED_INPUTS, "activation_quantization": "fp8-group"})
    results = engine.generate(PROMPTS, SamplingParams(max_tokens=40, temperature=0))
    assert [r.token_ids for r in results] == expected
    assert counts["fp8_weights"] and not counts["fp8_activations"]


def test_bf16_with_the_heads_input_rounded_is_the_rounded_model(monkeypatch) -> None:
    """fp8_lm_head_input: the LM head's GEMM reads FP8 activations too (its own launches over
    the FP8 MMA); the logprobs are the oracle's, whose head rounds its input, to bf16 precision,
    and graphs equal eager. The head's rounding turns a bf16 step of the final hidden state into
    an e4m3 step where an element sits at a rounding boundary, so the median gap is about twice
    that of the head reading bf16: 0.022-0.023 against 0.012-0.013 through the engine's torch
    path on CPU (two seeds), 0.024 here on one H200."""
    from rollout.kernels import triton_linear

    model = tiny_model("qwen3").to("cuda", torch.bfloat16)
    reference = rounded_copy(model, lm_head=True, input_scales="row", head_input=True)
    widths = set()
    launch = triton_linear.launch

    def recording(x, weight, bias, y, *args, x_scale=None, **kwargs):
        if x_scale is not None:
            widths.add(y.shape[-1])
        return launch(x, weight, bias, y, *args, x_scale=x_scale, **kwargs)

    monkeypatch.setattr(triton_linear, "launch", recording)
    settings = dict(
        ROUNDED_INPUTS, dtype="bfloat16", num_kv_blocks=400, max_num_seqs=64,
        fp8_lm_head_input=True,
    )  # fmt: skip
    engine = engine_for(model, ON_GPU, **settings)
    params = SamplingParams(max_tokens=40, temperature=1.0, n=4, seed=2)
    results = engine.generate(PROMPTS, params)
    assert model.config.vocab_size in widths
    diffs = logprob_differences(reference, PROMPTS, results)
    assert diffs.median() < 0.04 and diffs.max() < 0.25, (diffs.median(), diffs.max())
    again = engine_for(model, ON_GPU, cuda_graphs=False, **settings).generate(PROMPTS, params)
    assert [r.token_ids for r in again] == [r.token_ids for r in results]


@pytest.mark.parametrize("compile_model", [False, True])
@pytest.mark.parametrize("scales", ["row", "group"])
def test_bf16_rounded_inputs_through_the_fp8_mma_are_the_rounded_models(
    compile_model: bool, scales: str, monkeypatch
) -> None:
    """Up to 36 rows a step, so the FP8-MMA kernel runs at every decode step (and the FP8-weight
    kernel for the LM head); compiled, the rounding is inductor's, fused into the norms: the
    logprobs are the oracle's to bf16 precision, graphs equal eager. With a scale per 128 inputs, on a model
    whose inputs span several groups: its 4096x outliers make its bf16 logprobs noisier than the
    tiny Qwen3's (a median gap to the oracle of about 0.05 against 0.01 through the engine's
    torch path on CPU too), so its bounds are wider; a group read with another's scale is off by
    a power of two up to 4096."""
    if scales == "row":
        model, quantization = tiny_model("qwen3"), "fp8"
    else:
        model, quantization = wide_model_with_outliers(seed=4), "fp8-group"
    model = model.to("cuda", torch.bfloat16)
    reference = rounded_copy(model, lm_head=True, input_scales=scales)
    counts = _count_w8a8_launches(monkeypatch)
    fused = _count_fused_activations(monkeypatch)
    settings = dict(
        dtype="bfloat16", num_kv_blocks=400, max_num_seqs=64, compile_model=compile_model,
        activation_quantization=quantization,
    )  # fmt: skip
    engine = engine_for(model, ON_GPU, **{**ROUNDED_INPUTS, **settings})
    params = SamplingParams(max_tokens=40, temperature=1.0, n=4, seed=2)
    results = engine.generate(PROMPTS, params)
    assert counts["fp8_activations"] and counts["fp8_weights"]
    # a scale a row: decode's gate/up with the activation in its GEMM; per 128 inputs, unfused
    assert (len(fused) > 0) == (scales == "row")
    diffs = logprob_differences(reference, PROMPTS, results)
    median, peak = {"row": (0.02, 0.25), "group": (0.08, 0.6)}[scales]
    assert diffs.median() < median and diffs.max() < peak, (diffs.median(), diffs.max())
    eager = engine_for(model, ON_GPU, cuda_graphs=False, **{**ROUNDED_INPUTS, **settings})
    again = eager.generate(PROMPTS, params)
    assert [r.token_ids for r in again] == [r.token_ids for r in results]
