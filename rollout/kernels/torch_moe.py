"""The PyTorch twin of the fused MoE experts kernel: the same routing, order and rounding points.

An MoE layer's experts take each token's top-k (expert, weight) pairs. Both the twin and the
Triton kernel sort the token-expert pairs by expert, run each expert's SiLU-gated MLP over its
pairs (gate and up in fp32, their product rounded to the activations' dtype, as the kernel stores
it between its two launches), scale each pair's output by its routing weight in fp32 and round,
then sum each token's k pair outputs. It is the oracle of the kernel's tests, not a fast path.
`top_k_routing_reference` is the softmax routers' code in front of the experts, the twin of
`triton_routing.top_k_routing`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def top_k_routing_reference(
    router_logits: torch.Tensor, top_k: int, renormalize: bool, weights_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k], expert index [T, k]) as Qwen2/3-MoE's, OLMoE's and Mixtral's routers
    compute them from their logits [T, E]."""
    probs = F.softmax(router_logits, dtype=torch.float, dim=-1)
    weights, index = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(weights_dtype), index


def sort_by_expert(
    top_k_index: torch.Tensor, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pairs in expert order, pairs per expert, first sorted pair of each expert), all int32.
    A pair p is token p // k's choice p % k. Static shapes only, so CUDA graphs can capture it:
    the counts come from a scatter-add, not bincount (whose output size depends on the data)."""
    expert_of_pair = top_k_index.reshape(-1)
    _, order = torch.sort(expert_of_pair, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.int32, device=top_k_index.device)
    counts.scatter_add_(
        0, expert_of_pair.long(), torch.ones_like(expert_of_pair, dtype=torch.int32)
    )
    starts = torch.cumsum(counts, 0, dtype=torch.int32) - counts
    return order.to(torch.int32), counts, starts


def fused_experts_reference(
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
) -> torch.Tensor:
    """hidden_states [T, H]; top_k_index / top_k_weights [T, k]; gate_up_proj [E, 2I, H] (gate
    rows first, then up); down_proj [E, H, I]. Returns [T, H] in hidden_states' dtype."""
    num_tokens, hidden = hidden_states.shape
    top_k = top_k_index.shape[-1]
    num_experts, two_i, _ = gate_up_proj.shape
    inter = two_i // 2
    dtype = hidden_states.dtype
    order, counts, starts = sort_by_expert(top_k_index, num_experts)
    weights = top_k_weights.reshape(-1).float()
    pair_out = torch.zeros(num_tokens * top_k, hidden, dtype=dtype, device=hidden_states.device)
    for expert in range(num_experts):
        count = int(counts[expert])
        if count == 0:
            continue
        pairs = order[int(starts[expert]) : int(starts[expert]) + count].long()
        x = hidden_states[pairs // top_k].float()
        w = gate_up_proj[expert].float()
        gate = x @ w[:inter].T
        up = x @ w[inter:].T
        act = (F.silu(gate) * up).to(dtype)
        out = act.float() @ down_proj[expert].float().T
        pair_out[pairs] = (out * weights[pairs, None]).to(dtype)
    return pair_out.view(num_tokens, top_k, hidden).sum(dim=1)
