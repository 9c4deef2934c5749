"""An MoE router's softmax and top-k in one launch, for CUDA.

Softmax routers (Qwen2/3-MoE, OLMoE, Mixtral) turn a token's router logits into the k experts
it goes to and their weights: softmax in fp32, top-k, optionally the k weights renormalized to
sum to one, optionally cast to the activations' dtype. In PyTorch that is four to six launches
a layer (softmax, top-k's select and its sort, sum, divide, cast), each a few microseconds over a
few KB at decode; here one program per BLOCK_T tokens does it all in registers.

The experts are chosen by their logits, the larger first and the lower index first among equal
logits: the order of the softmax's probabilities, without depending on how exp rounds, except
where two logits so close that their fp32 probabilities round to the same value decide the k-th
place (there the larger logit is taken; torch.topk over the probabilities sees a tie). The
weights are the chosen experts' probabilities, divided by their sum (added in the chosen order)
when renormalizing. `torch_moe.top_k_routing_reference`, the routers' own PyTorch code, is the twin.
"""

from __future__ import annotations

import torch

from rollout.kernels.triton_import import tl, triton


@triton.jit
def _take_largest(remaining, experts, probs, EXPERTS_PAD: tl.constexpr):
    """Each token's largest remaining logit (the lower expert among equal ones): its expert, its
    probability, and the remaining logits with it taken out."""
    best = tl.max(remaining, axis=1)
    pick = tl.min(tl.where(remaining == best[:, None], experts[None, :], EXPERTS_PAD), 1)
    chosen = experts[None, :] == pick[:, None]
    prob = tl.sum(tl.where(chosen, probs, 0.0), axis=1)
    return pick, prob, tl.where(chosen, float("-inf"), remaining)


@triton.jit
def _top_k_routing_kernel(
    logits_ptr, weights_ptr, index_ptr, num_tokens, num_experts, stride_lt,
    TOP_K: tl.constexpr, RENORMALIZE: tl.constexpr, BLOCK_T: tl.constexpr,
    EXPERTS_PAD: tl.constexpr,
):  # fmt: skip
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    experts = tl.arange(0, EXPERTS_PAD)
    valid = (tokens < num_tokens)[:, None] & (experts < num_experts)[None, :]
    rows = tokens.to(tl.int64)[:, None] * stride_lt
    logits = tl.load(logits_ptr + rows + experts[None, :], mask=valid, other=float("-inf"))
    logits = logits.to(tl.float32)
    largest = tl.max(logits, axis=1)
    exps = tl.where(valid, tl.exp(logits - largest[:, None]), 0.0)
    probs = exps / tl.sum(exps, axis=1)[:, None]
    # Padded experts and padded tokens' columns are never chosen: -inf is below every logit.
    candidates = tl.where(experts[None, :] < num_experts, logits, float("-inf"))
    total = tl.zeros([BLOCK_T], tl.float32)
    if RENORMALIZE:  # a first pass for the sum of the chosen probabilities, in the chosen order
        remaining = candidates
        for _ in tl.static_range(TOP_K):
            _pick, prob, remaining = _take_largest(remaining, experts, probs, EXPERTS_PAD)
            total += prob
    token_ok = tokens < num_tokens
    remaining = candidates
    for j in tl.static_range(TOP_K):
        pick, weight, remaining = _take_largest(remaining, experts, probs, EXPERTS_PAD)
        if RENORMALIZE:
            weight = weight / total
        out = tokens.to(tl.int64) * TOP_K + j
        tl.store(index_ptr + out, pick.to(tl.int64), mask=token_ok)
        tl.store(weights_ptr + out, weight.to(weights_ptr.dtype.element_ty), mask=token_ok)


def supported(router_logits: torch.Tensor, top_k: int) -> bool:
    return (
        router_logits.is_cuda
        and router_logits.dim() == 2
        and 0 < top_k <= router_logits.shape[-1] <= 1024  # a token's logits in one program
    )


@torch.library.custom_op("rollout::top_k_routing", mutates_args=())
def top_k_routing(
    router_logits: torch.Tensor, top_k: int, renormalize: bool, weights_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] in weights_dtype, expert index [T, k] int64) for router_logits [T, E]."""
    num_tokens, num_experts = router_logits.shape
    weights = router_logits.new_empty(num_tokens, top_k, dtype=weights_dtype)
    index = router_logits.new_empty(num_tokens, top_k, dtype=torch.int64)
    if num_tokens == 0:
        return weights, index
    logits = router_logits if router_logits.stride(-1) == 1 else router_logits.contiguous()
    experts_pad = triton.next_power_of_2(num_experts)
    block_t = max(1, min(16, 2048 // experts_pad, triton.next_power_of_2(num_tokens)))
    _top_k_routing_kernel[(triton.cdiv(num_tokens, block_t),)](
        logits, weights, index, num_tokens, num_experts, logits.stride(0),
        TOP_K=top_k, RENORMALIZE=renormalize, BLOCK_T=block_t, EXPERTS_PAD=experts_pad,
        num_warps=4,
    )  # fmt: skip
    return weights, index


@top_k_routing.register_fake
def _(router_logits, top_k, renormalize, weights_dtype):
    num_tokens = router_logits.shape[0]
    return (
        router_logits.new_empty(num_tokens, top_k, dtype=weights_dtype),
        router_logits.new_empty(num_tokens, top_k, dtype=torch.int64),
    )
