"""Random paged-attention cases shared by the kernel tests (CPU interpreter and GPU)."""

from __future__ import annotations

import torch

from rollout.kernels.tiling import EXTEND_BLOCK_M


def make_case(
    seq_lens: list[int],
    query_lens: list[int],
    num_kv_heads: int,
    group: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: str,
    seed: int = 0,
    extra_blocks: int = 3,
):
    """Caches filled with random values, shuffled block tables, packed queries."""
    g = torch.Generator().manual_seed(seed)
    num_heads = num_kv_heads * group
    pages = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(pages) + extra_blocks
    perm = torch.randperm(num_blocks, generator=g)
    max_pages = max(pages)
    block_tables = torch.zeros(len(seq_lens), max_pages, dtype=torch.int32)
    used = 0
    for s, p in enumerate(pages):
        block_tables[s, :p] = perm[used : used + p]
        used += p
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=g).to(dtype)
    v_cache = torch.randn(shape, generator=g).to(dtype)
    num_tokens = sum(query_lens)
    query = torch.randn(num_tokens, num_heads, head_dim, generator=g).to(dtype)
    qsl = [0]
    for q in query_lens:
        qsl.append(qsl[-1] + q)
    q_block_seq, q_block_start = [], []
    for s, q in enumerate(query_lens):
        for m0 in range(0, q, EXTEND_BLOCK_M):
            q_block_seq.append(s)
            q_block_start.append(m0)
    to = dict(device=device)
    return dict(
        query=query.to(**to),
        k_cache=k_cache.to(**to),
        v_cache=v_cache.to(**to),
        block_tables=block_tables.to(**to),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        q_block_seq=torch.tensor(q_block_seq, dtype=torch.int32, device=device),
        q_block_start=torch.tensor(q_block_start, dtype=torch.int32, device=device),
        query_start_loc_host=qsl,
        seq_lens_host=list(seq_lens),
        scale=head_dim**-0.5,
    )


def with_fp8_cache(case: dict, v_by_token: bool = True) -> dict:
    """The same case with its caches in FP8: e4m3 rows and a power-of-two scale per (token,
    head), as the engine's FP8 KV write stores them, V laid out by token and the scales head by
    head as the engine holds them (or both as a bf16 cache's values: by dim, and by slot); the
    scales under "kv_scales"."""
    from rollout.kernels import torch_paged_attention
    from rollout.kernels.torch_fp8 import quantize_kv

    k_cache, k_scale = quantize_kv(case["k_cache"])
    v_cache, v_scale = quantize_kv(case["v_cache"])
    if v_by_token:
        k_cache = torch_paged_attention.keys_by_head(k_cache)
        v_cache = torch_paged_attention.v_by_token(v_cache)
        k_scale = torch_paged_attention.scales_by_head(k_scale)
        v_scale = torch_paged_attention.scales_by_head(v_scale)
    return {**case, "k_cache": k_cache, "v_cache": v_cache, "kv_scales": (k_scale, v_scale)}


def with_nan_leftovers(case: dict) -> dict:
    """The case's FP8 caches with e4m3's NaN in every slot of each sequence's last page past its
    context: another sequence's leftovers, which no read may let through."""
    block_size = case["k_cache"].shape[1]
    for s, n in enumerate(case["seq_lens_host"]):
        last = case["block_tables"][s, (n - 1) // block_size]
        for cache in (case["k_cache"], case["v_cache"]):
            cache.view(torch.uint8)[last, (n - 1) % block_size + 1 :] = 0x7F
    return case


def wide_range_fp8_case(seq_lens, query_lens, num_kv_heads, head_dim, device) -> dict:
    """An FP8-cache case (group of 4) whose bf16 query rows span 1e-4 to 1e6, past fp16's range,
    and whose last KV head holds values near 1e-7, their scales far below fp16's normal range:
    what fp16 K tiles must scale their way around. The bf16 query under "query_bf16"."""
    case = make_case(seq_lens, query_lens, num_kv_heads, 4, head_dim, 16, torch.float32, device)
    case["query"] *= torch.logspace(-4, 6, case["query"].shape[1], device=device)[None, :, None]
    case["v_cache"][:, :, -1] *= 1e-7
    case = with_fp8_cache(case)
    return {**case, "query_bf16": case["query"].to(torch.bfloat16)}


def fp8_attention_error_bound(case: dict, probability_rounding: float):
    """(the fp32 twin's attention of the case's bf16 query over its FP8 cache, the error a
    kernel may make there): one bf16 unit of the result plus `probability_rounding` times the
    same attention over |values| (the rounding of the probabilities before the value dot)."""
    from rollout.kernels import torch_paged_attention as twin

    def attention(v_cache):
        return twin.paged_attention(
            case["query_bf16"].float(), case["k_cache"], v_cache, case["block_tables"],
            case["query_start_loc_host"], case["seq_lens_host"], case["scale"],
            kv_scales=case["kv_scales"],
        )  # fmt: skip

    want = attention(case["v_cache"])
    magnitudes = (case["v_cache"].view(torch.uint8) & 0x7F).view(case["v_cache"].dtype)
    return want, 2**-7 * want.abs() + probability_rounding * attention(magnitudes)


def attend(case: dict, query, max_context: int, tiles=None):
    """The Triton kernels over `case` for `query` (its FP8 scales if any): the decode kernel when
    every sequence has one query token (`tiles`, up to `max_context`), else the extend kernel."""
    from rollout.kernels import triton_paged_attention as kernels

    kv = (case["k_cache"], case["v_cache"], case["block_tables"])
    if query.shape[0] == case["seq_lens"].shape[0]:
        return kernels.decode_attention(
            query, *kv, case["seq_lens"], case["scale"], max_context, tiles,
            kv_scales=case.get("kv_scales"),
        )  # fmt: skip
    return kernels.extend_attention(
        query, *kv, case["query_start_loc"], case["seq_lens"], case["q_block_seq"],
        case["q_block_start"], case["scale"], kv_scales=case.get("kv_scales"),
    )  # fmt: skip
