"""On-device sampling with per-token logprobs and counter-based seeded randomness.

Randomness: a row's noise is a hash of (row key, vocabulary index), where the row key mixes the
request seed, the sample index and the output position. So a token depends only on its own
request, never on the batch around it, on preemption, or on which loop ran it; no generator state
lives on the device and nothing syncs with the host. The noise is Gumbel: argmax(logits/T + g)
draws from softmax(logits/T).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rollout.engine.scheduling.sample_keys import MASK32 as _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash on int64 tensors holding values in [0, 2^32).

    Multipliers are < 2^31 so products stay below 2^63 (no signed overflow).
    """
    return _mix32_(x.clone())


def _mix32_(x: torch.Tensor) -> torch.Tensor:
    """_mix32 in place: the sampler hashes a [rows, vocab] tensor per step, and on CPU the
    temporaries of the out-of-place version cost a third of its time."""
    x ^= x >> 16
    x.mul_(0x7FEB352D).bitwise_and_(_M32)
    x ^= x >> 15
    x.mul_(0x5BD1E995).bitwise_and_(_M32)
    x ^= x >> 16
    return x


@dataclass
class SamplingTensors:
    """Per-row sampling parameters on the device (views of the step slot's buffers)."""

    temperature: torch.Tensor  # [rows] float32; 0 = greedy
    top_k: torch.Tensor  # [rows] int64; 0 = off
    top_p: torch.Tensor  # [rows] float32; 1 = off
    min_p: torch.Tensor  # [rows] float32; 0 = off
    keys: torch.Tensor  # [rows] int64, from row_keys()
    needs_sort: bool  # some row uses top-k or top-p (a host-side flag: skip the sort otherwise)
    needs_min_p: bool


class Sampler:
    def __init__(self, vocab_size: int, device: torch.device, use_triton: bool = False) -> None:
        # Hash of each vocabulary index, mixed with the row key per step.
        self.vocab_hash = _mix32(
            torch.arange(vocab_size, dtype=torch.int64, device=device) + 0x3C6E
        )
        self.use_triton = use_triton

    def sample_into(
        self,
        logits: torch.Tensor,  # [num_logits, vocab]
        row_logits: torch.Tensor,  # [rows] int64
        params: SamplingTensors,
        tokens_out: torch.Tensor,  # [rows] int64
        logprobs_out: torch.Tensor,  # [rows] float32
    ) -> None:
        """Sample every row into the output buffers. Rows without filters go through the one-pass
        Triton kernel on CUDA; filtered batches use the torch path below (the twin)."""
        if self.use_triton and not (params.needs_sort or params.needs_min_p):
            from rollout.kernels.triton_sampler import sample_plain

            sample_plain(
                logits, row_logits, params.temperature, params.keys, tokens_out, logprobs_out
            )
            return
        tokens, logprobs = self(logits[row_logits], params)
        tokens_out.copy_(tokens)
        logprobs_out.copy_(logprobs)

    def __call__(
        self, logits: torch.Tensor, params: SamplingTensors
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [rows, vocab] -> (token ids [rows] int64, logprobs [rows] float32)."""
        logits = logits.float()
        greedy = params.temperature == 0
        temperature = torch.where(greedy, 1.0, params.temperature)[:, None]
        scaled = logits / temperature  # [rows, vocab]
        logprobs_all = torch.log_softmax(scaled, dim=-1)
        filtered = self._filter(scaled, logprobs_all, params)
        sampled = torch.argmax(filtered + self._gumbel(params.keys, logits.shape[1]), dim=-1)
        tokens = torch.where(greedy, torch.argmax(logits, dim=-1), sampled)
        logprobs = torch.gather(logprobs_all, 1, tokens[:, None])[:, 0]
        return tokens, logprobs

    def _gumbel(self, keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
        bits = _mix32_(keys[:, None] ^ self.vocab_hash[None, :vocab_size])  # [rows, vocab]
        # 23 random bits -> u in [2^-24, 1 - 2^-24]: exact in fp32, never 0 or 1 (finite noise).
        u = bits.bitwise_right_shift_(9).float().add_(0.5).mul_(1.0 / (1 << 23))
        return u.log_().neg_().log_().neg_()  # -log(-log(u))

    @staticmethod
    def _filter(
        scaled: torch.Tensor, logprobs: torch.Tensor, params: SamplingTensors
    ) -> torch.Tensor:
        """Set tokens outside top-k / top-p / min-p to -inf (the most likely token always stays)."""
        if params.needs_min_p:
            max_logprob = logprobs.max(dim=-1, keepdim=True).values
            floor = max_logprob + torch.log(params.min_p.clamp(min=1e-30))[:, None]
            drop = (logprobs < floor) & (params.min_p[:, None] > 0)
            scaled = scaled.masked_fill(drop, float("-inf"))
        if params.needs_sort:
            sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
            vocab = scaled.shape[1]
            ranks = torch.arange(vocab, device=scaled.device)[None, :]
            k = torch.where(params.top_k > 0, params.top_k, vocab)[:, None]
            drop = ranks >= k
            probs = torch.softmax(sorted_logits, dim=-1)
            mass_before = (
                torch.cumsum(probs, dim=-1) - probs
            )  # probability of strictly better tokens
            drop |= (mass_before >= params.top_p[:, None]) & (params.top_p[:, None] < 1)
            drop[:, 0] = False
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            scaled = torch.empty_like(scaled).scatter_(1, order, sorted_logits)
        return scaled
