"""Fused MoE experts for CUDA: each touched expert's weights read once per step.

At decode an MoE layer's tokens pick k of E experts each, so a step touches most experts with a
few tokens apiece, and its time is the read of the touched experts' weights. The step's
token-expert pairs are first put in expert order (`triton_expert_sort`: a counting sort in one
launch at decode). Then two grouped launches over a grid of (expert, output-column block):

1. gate/up: each program streams its expert's gate and up rows for its column block once and
   multiplies every pair of that expert by them (BLOCK_M pairs at a time), then stores
   SiLU(gate) * up for those pairs, in expert order.
2. down: the same over the down projection, scaling each pair's row by its routing weight, and
   storing it at the pair's own place; each token's k rows are then summed.

Experts that no pair picked exit at once, so their weights are never read. Parameters stay the
transformers model's own 3-D tensors (`gate_up_proj` [E, 2I, H], `down_proj` [E, H, I]), so weight
sync and the trainer see the same names. With FP8 weights (`fp8_weights.py`) both launches read
the e4m3 copies, widen each tile in registers and scale each output column once. It runs as the custom op `rollout::fused_experts`, opaque
to torch.compile; `torch_moe.fused_experts_reference` is its twin.
"""

from __future__ import annotations

import torch

from rollout.kernels.gpu_features import sm_count
from rollout.kernels.torch_fp8 import FP8_DTYPE
from rollout.kernels.triton_expert_sort import sort_pairs_by_expert
from rollout.kernels.triton_fp8_widen import fast_widen, widen_e4m3
from rollout.kernels.triton_import import tl, triton


@triton.jit
def _gate_up_kernel(
    x_ptr, w_ptr, s_ptr, order_ptr, counts_ptr, starts_ptr, act_ptr,
    H, INTER, TOP_K, stride_xt, stride_we, stride_wn, stride_at, stride_se,
    FP8: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    FAST_WIDEN: tl.constexpr,
):  # fmt: skip
    expert = tl.program_id(0)
    count = tl.load(counts_ptr + expert)
    if count == 0:
        return
    start = tl.load(starts_ptr + expert)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < INTER
    w_gate = w_ptr + expert.to(tl.int64) * stride_we + offs_n[None, :] * stride_wn
    w_up = w_gate + INTER * stride_wn
    for m0 in range(0, count, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        m_mask = offs_m < count
        pair = tl.load(order_ptr + start + offs_m, mask=m_mask, other=0)
        x_rows = x_ptr + (pair // TOP_K).to(tl.int64)[:, None] * stride_xt
        gate = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, H, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_mask = offs_k < H
            x = tl.load(x_rows + offs_k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            w_mask = k_mask[:, None] & n_mask[None, :]
            wg = tl.load(w_gate + offs_k[:, None], mask=w_mask, other=0.0)
            wu = tl.load(w_up + offs_k[:, None], mask=w_mask, other=0.0)
            if FP8:  # e4m3 widens exactly
                wg = widen_e4m3(wg, x.dtype, FAST_WIDEN, False)
                wu = widen_e4m3(wu, x.dtype, FAST_WIDEN, False)
            if IEEE:
                gate = tl.dot(x, wg, gate, input_precision="ieee")
                up = tl.dot(x, wu, up, input_precision="ieee")
            else:
                gate = tl.dot(x, wg, gate)
                up = tl.dot(x, wu, up)
        if FP8:  # each output row's scale, once per accumulator column
            scales = s_ptr + expert.to(tl.int64) * stride_se + offs_n
            gate *= tl.load(scales, mask=n_mask, other=0.0)[None, :]
            up *= tl.load(scales + INTER, mask=n_mask, other=0.0)[None, :]
        act = gate / (1.0 + tl.exp(-gate)) * up
        rows = (start + offs_m).to(tl.int64)
        tl.store(
            act_ptr + rows[:, None] * stride_at + offs_n[None, :],
            act.to(act_ptr.dtype.element_ty),
            mask=m_mask[:, None] & n_mask[None, :],
        )


@triton.jit
def _down_kernel(
    act_ptr, w_ptr, s_ptr, order_ptr, counts_ptr, starts_ptr, weights_ptr, out_ptr,
    H, INTER, stride_at, stride_we, stride_wn, stride_ot, stride_se,
    FP8: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    FAST_WIDEN: tl.constexpr,
):  # fmt: skip
    expert = tl.program_id(0)
    count = tl.load(counts_ptr + expert)
    if count == 0:
        return
    start = tl.load(starts_ptr + expert)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < H
    w_cols = w_ptr + expert.to(tl.int64) * stride_we + offs_n[None, :] * stride_wn
    for m0 in range(0, count, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        m_mask = offs_m < count
        rows = (start + offs_m).to(tl.int64)
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(0, INTER, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_mask = offs_k < INTER
            a = tl.load(
                act_ptr + rows[:, None] * stride_at + offs_k[None, :],
                mask=m_mask[:, None] & k_mask[None, :],
                other=0.0,
            )
            w = tl.load(w_cols + offs_k[:, None], mask=k_mask[:, None] & n_mask[None, :], other=0.0)
            if FP8:
                w = widen_e4m3(w, a.dtype, FAST_WIDEN, False)
            if IEEE:
                acc = tl.dot(a, w, acc, input_precision="ieee")
            else:
                acc = tl.dot(a, w, acc)
        pair = tl.load(order_ptr + start + offs_m, mask=m_mask, other=0)
        routing = tl.load(weights_ptr + pair, mask=m_mask, other=0.0).to(tl.float32)
        acc = acc * routing[:, None]
        if FP8:
            scales = s_ptr + expert.to(tl.int64) * stride_se + offs_n
            acc *= tl.load(scales, mask=n_mask, other=0.0)[None, :]
        tl.store(
            out_ptr + pair.to(tl.int64)[:, None] * stride_ot + offs_n[None, :],
            acc.to(out_ptr.dtype.element_ty),
            mask=m_mask[:, None] & n_mask[None, :],
        )


def supported(hidden_states: torch.Tensor, gate_up_proj: torch.Tensor) -> bool:
    return (
        hidden_states.is_cuda
        and hidden_states.dtype in (torch.bfloat16, torch.float16, torch.float32)
        and gate_up_proj.dtype in (hidden_states.dtype, FP8_DTYPE)
    )


# From this many pairs an expert on average (an 8,192-token prefill chunk at 128 experts, top-8)
# the experts are compute-bound, and larger tiles with more warps win (docs/performance.md,
# 'MoE experts'); fp32 (tests) keeps the smaller tiles, whose shared memory it fits.
PREFILL_PAIRS_PER_EXPERT = 512
PREFILL_TILES = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4)
# A single sequence's step (Qwen3-30B-A3B: 8 of 128 experts) touches so few experts that their
# 64-wide column blocks are fewer programs than the GPU has SMs; narrower blocks with longer K
# steps and a deeper pipeline keep more of the weights in flight (48 -> 36 us a layer there).
TAIL_TILES = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, num_warps=4, num_stages=4)
DECODE_BLOCK_N = 64


def tiles(
    num_pairs: int, num_experts: int, dtype: torch.dtype, inter: int = 0, sm_count: int = 0
) -> dict:
    """Launch settings: the tail tiles while the pairs' column blocks would not fill the
    `sm_count` SMs once; else BLOCK_M follows the pairs an expert gets on average (16 at decode,
    up to 64 for prefill chunks, where each expert has hundreds; 128 x 128 tiles from
    PREFILL_PAIRS_PER_EXPERT on); fp32 (tests) takes smaller K tiles."""
    if num_pairs * triton.cdiv(inter, DECODE_BLOCK_N) < sm_count:
        return dict(TAIL_TILES)
    per_expert = max(1, num_pairs // max(1, num_experts))
    if per_expert >= PREFILL_PAIRS_PER_EXPERT and dtype != torch.float32:
        return dict(PREFILL_TILES)
    block_m = min(64, max(16, triton.next_power_of_2(per_expert)))
    block_k = 32 if dtype == torch.float32 else 64
    return dict(BLOCK_M=block_m, BLOCK_N=DECODE_BLOCK_N, BLOCK_K=block_k, num_warps=4, num_stages=3)


@torch.library.custom_op("rollout::fused_experts", mutates_args=())
def fused_experts(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    gate_up_scale: torch.Tensor | None = None,
    down_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """The experts' output [T, H] for hidden_states [T, H] routed by top_k_index/weights [T, k].
    With the scales ([E, 2I], [E, H]) the weights are FP8 (e4m3, a scale per output row)."""
    num_tokens, hidden = hidden_states.shape
    top_k = top_k_index.shape[-1]
    num_experts, two_i, _ = gate_up_proj.shape
    inter = two_i // 2
    num_pairs = num_tokens * top_k
    if num_pairs == 0:
        return hidden_states.new_zeros(num_tokens, hidden)
    out = hidden_states.new_empty(num_tokens, top_k, hidden)  # the down launch writes every pair
    x = hidden_states.contiguous()
    gate_up = gate_up_proj if gate_up_proj.stride(-1) == 1 else gate_up_proj.contiguous()
    down = down_proj if down_proj.stride(-1) == 1 else down_proj.contiguous()
    order, counts, starts = sort_pairs_by_expert(top_k_index, num_experts)
    weights = top_k_weights.reshape(-1).contiguous()
    act = hidden_states.new_empty(num_pairs, inter)
    settings = tiles(num_pairs, num_experts, hidden_states.dtype, inter, sm_count(x.device))
    ieee = hidden_states.dtype == torch.float32
    fp8 = gate_up_scale is not None
    if fp8 and (
        down_scale is None or not gate_up_scale.is_contiguous() or not down_scale.is_contiguous()
    ):
        raise ValueError("FP8 experts need contiguous gate_up_scale [E, 2I] and down_scale [E, H]")
    gate_up_scale = gate_up_scale if fp8 else weights  # unread without FP8
    down_scale = down_scale if fp8 else weights
    fast = fp8 and fast_widen(x.dtype, x.device)
    block_n = settings["BLOCK_N"]
    _gate_up_kernel[(num_experts, triton.cdiv(inter, block_n))](
        x, gate_up, gate_up_scale, order, counts, starts, act,
        hidden, inter, top_k, x.stride(0), gate_up.stride(0), gate_up.stride(1), act.stride(0),
        two_i if fp8 else 0, FP8=fp8, IEEE=ieee, FAST_WIDEN=fast, **settings,
    )  # fmt: skip
    pair_out = out.view(num_pairs, hidden)
    _down_kernel[(num_experts, triton.cdiv(hidden, block_n))](
        act, down, down_scale, order, counts, starts, weights, pair_out,
        hidden, inter, act.stride(0), down.stride(0), down.stride(1), pair_out.stride(0),
        hidden if fp8 else 0, FP8=fp8, IEEE=ieee, FAST_WIDEN=fast, **settings,
    )  # fmt: skip
    return out.sum(dim=1)


@fused_experts.register_fake
def _(
    hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj, gate_up_scale=None,
    down_scale=None,
) -> torch.Tensor:  # fmt: skip
    return hidden_states.new_empty(hidden_states.shape)


# FP8 expert weights pay from this many tokens a step (bench_moe.py on one H200, Qwen3-30B-A3B's
# experts, e4m3 widened by triton_fp8_widen): at 1 token the FP8 kernel takes 40 us against
# bf16's 35 (the tail tiles' few programs are not bound by the read), at 8, 32 and 128 tokens
# 129 / 223 / 269 us against 141 / 258 / 303. Below it the bf16 weights, which hold the same values.
FP8_EXPERTS_MIN_TOKENS = 8


@torch.library.custom_op("rollout::fused_experts_fp8", mutates_args=())
def fused_experts_fp8(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
    gate_up_fp8: torch.Tensor,
    gate_up_scale: torch.Tensor,
    down_fp8: torch.Tensor,
    down_scale: torch.Tensor,
) -> torch.Tensor:
    """`fused_experts` over the FP8 copies of the experts' weights where that pays
    (FP8_EXPERTS_MIN_TOKENS), else over the bf16 weights: the same values either way."""
    if hidden_states.shape[0] >= FP8_EXPERTS_MIN_TOKENS:
        return fused_experts(
            hidden_states, top_k_index, top_k_weights, gate_up_fp8, down_fp8, gate_up_scale,
            down_scale,
        )  # fmt: skip
    return fused_experts(hidden_states, top_k_index, top_k_weights, gate_up_proj, down_proj)


@fused_experts_fp8.register_fake
def _(hidden_states, top_k_index, top_k_weights, *weights) -> torch.Tensor:
    return hidden_states.new_empty(hidden_states.shape)
