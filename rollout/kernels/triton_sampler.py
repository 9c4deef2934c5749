"""One-pass sampling in Triton for rows without top-k/top-p/min-p (the common RL case).

Twin of `Sampler` in rollout/engine/sampler.py (same hash, same Gumbel noise, same logprob
definition): per row it streams the vocabulary once, keeping an online log-sum-exp of
logits / T and the argmax of logits / T + noise (raw logits for greedy rows), reading the logits
where the model wrote them. The torch twin materialises a dozen [rows, vocab] temporaries; at
256 rows x 152K vocabulary that is gigabytes of traffic per step, this is one read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_V = 2048


@triton.jit
def _mix32(x):
    # Same 32-bit hash as sampler._mix32; uint32 multiplication wraps like the masked int64 one.
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x5BD1E995
    return x ^ (x >> 16)


@triton.jit
def _sample_kernel(
    logits_ptr, row_logits_ptr, temperature_ptr, keys_ptr, tokens_ptr, logprobs_ptr,
    stride_logits, vocab_size, BLOCK: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)
    src = tl.load(row_logits_ptr + r).to(tl.int64)
    temperature = tl.load(temperature_ptr + r)
    greedy = temperature == 0.0
    t = tl.where(greedy, 1.0, temperature)
    key = tl.load(keys_ptr + r).to(tl.uint32)
    row = logits_ptr + src * stride_logits
    run_max = float("-inf")
    run_sum = 0.0
    best = float("-inf")
    best_index = 0
    for v0 in range(0, vocab_size, BLOCK):
        offs = v0 + tl.arange(0, BLOCK)
        mask = offs < vocab_size
        x = tl.load(row + offs, mask=mask, other=float("-inf")).to(tl.float32)
        scaled = tl.math.div_rn(x, t)
        chunk_max = tl.max(scaled, 0)
        new_max = tl.maximum(run_max, chunk_max)
        run_sum = run_sum * tl.exp(run_max - new_max) + tl.sum(tl.exp(scaled - new_max), 0)
        run_max = new_max
        vocab_hash = _mix32((offs + 0x3C6E).to(tl.uint32))
        bits = _mix32(key ^ vocab_hash)
        u = ((bits >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
        noise = -tl.log(-tl.log(u))
        score = tl.where(greedy, x, scaled + noise)
        score = tl.where(mask, score, float("-inf"))
        chunk_best = tl.max(score, 0)
        chunk_index = tl.argmax(score, 0) + v0
        take = chunk_best > best  # strict: ties keep the earlier index, like torch.argmax
        best_index = tl.where(take, chunk_index, best_index)
        best = tl.where(take, chunk_best, best)
    chosen = tl.load(row + best_index).to(tl.float32)
    tl.store(tokens_ptr + r, best_index.to(tl.int64))
    tl.store(logprobs_ptr + r, tl.math.div_rn(chosen, t) - run_max - tl.log(run_sum))


def sample_plain(
    logits: torch.Tensor,  # [num_logits, vocab] (any float dtype; read in place)
    row_logits: torch.Tensor,  # [rows] int64: which logits row each sample draws from
    temperature: torch.Tensor,  # [rows] float32; 0 = greedy
    keys: torch.Tensor,  # [rows] int64 (32-bit values)
    tokens_out: torch.Tensor,  # [rows] int64
    logprobs_out: torch.Tensor,  # [rows] float32
) -> None:
    rows = row_logits.shape[0]
    if rows == 0:
        return
    assert logits.stride(1) == 1, "logits rows must be contiguous"
    _sample_kernel[(rows,)](
        logits, row_logits, temperature, keys, tokens_out, logprobs_out,
        logits.stride(0), logits.shape[1], BLOCK=BLOCK_V, num_warps=8,
    )  # fmt: skip
