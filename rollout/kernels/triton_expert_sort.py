"""An MoE step's (token, expert) pairs put in expert order on the GPU, stably, as
`torch_moe.sort_by_expert` does: the order `triton_moe`'s grouped launches walk.

Up to `COUNTING_SORT_MAX_PAIRS` pairs by a counting sort with one program per expert, each of
which reads all the pairs, counts its own and the lower experts' (its start), and places its own
pairs in order: a decode step's pairs are a few KB, so one launch of independent programs is
cheaper than torch.sort's radix passes over 64-bit keys. Larger prefill chunks by torch.sort.
"""

from __future__ import annotations

import torch

from rollout.kernels.torch_moe import sort_by_expert
from rollout.kernels.triton_import import tl, triton

# Above this many pairs (2,048 tokens at top-8, prefill chunks) torch.sort's radix passes: every
# counting program reads all the pairs, which grows with the chunk (see docs/performance.md).
COUNTING_SORT_MAX_PAIRS = 16384


@triton.jit
def _counting_sort_kernel(
    expert_ptr, order_ptr, counts_ptr, starts_ptr, num_pairs, NUM_EXPERTS, CHUNK: tl.constexpr,
):  # fmt: skip
    """One program per expert, all independent: it counts the pairs of its expert and those of
    lower experts (its first sorted place), then places its own pairs in pair order (stable)."""
    expert = tl.program_id(0)
    count = 0
    start = 0
    for c0 in range(0, num_pairs, CHUNK):
        pairs = c0 + tl.arange(0, CHUNK)
        chosen = tl.load(expert_ptr + pairs, mask=pairs < num_pairs, other=NUM_EXPERTS)
        count += tl.sum((chosen == expert).to(tl.int32), axis=0)
        start += tl.sum((chosen < expert).to(tl.int32), axis=0)
    tl.store(counts_ptr + expert, count)
    tl.store(starts_ptr + expert, start)
    if count == 0:
        return
    placed = start  # where this expert's next pair goes
    for c0 in range(0, num_pairs, CHUNK):
        pairs = c0 + tl.arange(0, CHUNK)
        chosen = tl.load(expert_ptr + pairs, mask=pairs < num_pairs, other=NUM_EXPERTS)
        mine = (chosen == expert).to(tl.int32)
        earlier = tl.cumsum(mine, axis=0) - mine  # this expert's pairs before it in the chunk
        tl.store(order_ptr + placed + earlier, pairs, mask=mine == 1)
        placed += tl.sum(mine, axis=0)


def sort_pairs_by_expert(
    top_k_index: torch.Tensor, num_experts: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`torch_moe.sort_by_expert`'s result (the same stable order), on the GPU."""
    expert_of_pair = top_k_index.reshape(-1)
    num_pairs = expert_of_pair.numel()
    if num_pairs > COUNTING_SORT_MAX_PAIRS:
        return sort_by_expert(top_k_index, num_experts)
    expert_of_pair = expert_of_pair.contiguous()
    order = torch.empty(num_pairs, dtype=torch.int32, device=top_k_index.device)
    counts = torch.empty(num_experts, dtype=torch.int32, device=top_k_index.device)
    starts = torch.empty_like(counts)
    chunk = max(16, min(triton.next_power_of_2(num_pairs), 4096))
    _counting_sort_kernel[(num_experts,)](
        expert_of_pair, order, counts, starts, num_pairs, num_experts, CHUNK=chunk, num_warps=4,
    )  # fmt: skip
    return order, counts, starts
