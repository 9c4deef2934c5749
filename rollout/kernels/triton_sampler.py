"""One-pass sampling in Triton for rows without top-k/top-p/min-p (the common RL case).

Twin of `Sampler` in rollout/engine/execution/sampler.py (same hash, same Gumbel noise, same logprob
definition): the vocabulary is streamed once, keeping an online log-sum-exp of logits / T and the
argmax of logits / T + noise (raw logits for greedy rows), reading the logits where the model
wrote them. The torch twin materialises a dozen [rows, vocab] temporaries; at 256 rows x 152K
vocabulary that is gigabytes of traffic per step, this is one read.

Each row's vocabulary is split into slices handled by separate programs, then a second small
kernel merges the slices: with one program per row, a decode batch of a few dozen rows leaves
most of the GPU's SMs idle; split, every SM streams (docs/performance.md, run 5).
"""

from __future__ import annotations

import torch

from rollout.kernels.triton_import import tl, triton

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
def _sample_slice_kernel(
    logits_ptr, row_logits_ptr, temperature_ptr, keys_ptr, part_ptr, part_index_ptr,
    stride_logits, vocab_size, slice_len, NUM_SLICES: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)
    sl = tl.program_id(1)
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
    start = sl * slice_len
    end = tl.minimum(start + slice_len, vocab_size)
    for i in range(0, slice_len, BLOCK):
        v0 = start + i
        offs = v0 + tl.arange(0, BLOCK)
        mask = offs < end
        x = tl.load(row + offs, mask=mask, other=float("-inf")).to(tl.float32)
        scaled = tl.math.div_rn(x, t)
        chunk_max = tl.max(scaled, 0)
        new_max = tl.maximum(run_max, chunk_max)
        # A slice wholly masked keeps run_max = -inf: guard the exp of (-inf) - (-inf).
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)
        run_sum = run_sum * tl.exp(run_max - safe_max) + tl.sum(tl.exp(scaled - safe_max), 0)
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
    part = part_ptr + (r * NUM_SLICES + sl) * 3
    tl.store(part, run_max)
    tl.store(part + 1, run_sum)
    tl.store(part + 2, best)
    tl.store(part_index_ptr + r * NUM_SLICES + sl, best_index)


@triton.jit
def _sample_merge_kernel(
    logits_ptr, row_logits_ptr, temperature_ptr, part_ptr, part_index_ptr, tokens_ptr,
    logprobs_ptr, stride_logits, NUM_SLICES: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)
    s = tl.arange(0, NUM_SLICES)
    part = part_ptr + (r * NUM_SLICES + s) * 3
    maxes = tl.load(part)
    sums = tl.load(part + 1)
    bests = tl.load(part + 2)
    run_max = tl.max(maxes, 0)
    total = tl.sum(tl.where(maxes == float("-inf"), 0.0, sums * tl.exp(maxes - run_max)), 0)
    # Slices are in vocabulary order and argmax keeps the first maximum: ties go to the lower
    # token id, as in the single pass.
    winner = tl.argmax(bests, 0)
    best_index = tl.load(part_index_ptr + r * NUM_SLICES + winner)
    src = tl.load(row_logits_ptr + r).to(tl.int64)
    temperature = tl.load(temperature_ptr + r)
    t = tl.where(temperature == 0.0, 1.0, temperature)
    chosen = tl.load(logits_ptr + src * stride_logits + best_index).to(tl.float32)
    tl.store(tokens_ptr + r, best_index.to(tl.int64))
    tl.store(logprobs_ptr + r, tl.math.div_rn(chosen, t) - run_max - tl.log(total))


def num_slices(rows: int, vocab_size: int, target_programs: int = 512) -> int:
    """Slices per row: enough programs to fill the GPU, each at least one BLOCK_V long."""
    by_programs = triton.next_power_of_2(max(1, -(-target_programs // rows)))
    by_length = max(1, triton.next_power_of_2(vocab_size // BLOCK_V) // 2)
    return max(1, min(by_programs, by_length, 64))


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
    vocab = logits.shape[1]
    slices = num_slices(rows, vocab)
    slice_len = -(-vocab // (slices * BLOCK_V)) * BLOCK_V  # whole blocks per slice
    # (max, sum, best score) and the best index of every slice; inside a CUDA-graph capture
    # these come from the graph's pool and stay put across replays.
    part = torch.empty(rows, slices, 3, dtype=torch.float32, device=logits.device)
    part_index = torch.empty(rows, slices, dtype=torch.int32, device=logits.device)
    _sample_slice_kernel[(rows, slices)](
        logits, row_logits, temperature, keys, part, part_index,
        logits.stride(0), vocab, slice_len, NUM_SLICES=slices, BLOCK=BLOCK_V, num_warps=8,
    )  # fmt: skip
    _sample_merge_kernel[(rows,)](
        logits, row_logits, temperature, part, part_index, tokens_out, logprobs_out,
        logits.stride(0), NUM_SLICES=slices, num_warps=1,
    )  # fmt: skip
