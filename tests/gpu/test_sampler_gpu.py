"""The one-pass Triton sampler against the torch sampler it twins, on the GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rollout.engine.execution.sampler import Sampler, SamplingTensors
from rollout.engine.scheduling.sample_keys import row_keys

pytestmark = pytest.mark.gpu


def _params(temperature: torch.Tensor, keys: torch.Tensor) -> SamplingTensors:
    rows = temperature.shape[0]
    return SamplingTensors(
        temperature=temperature,
        top_k=torch.zeros(rows, dtype=torch.int64, device="cuda"),
        top_p=torch.ones(rows, device="cuda"),
        min_p=torch.zeros(rows, device="cuda"),
        keys=keys,
        needs_sort=False,
        needs_min_p=False,
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_triton_sampler_matches_torch_twin(dtype: torch.dtype) -> None:
    rows, vocab = 96, 50_257
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(rows, vocab, device="cuda", generator=g) * 3).to(dtype)
    temperature = torch.tensor([0.0, 0.6, 1.0, 1.3] * (rows // 4), device="cuda")
    keys_host = row_keys(
        np.arange(rows, dtype=np.uint64),
        np.zeros(rows, np.uint64),
        np.arange(rows, dtype=np.uint64),
    )
    keys = torch.from_numpy(keys_host).cuda()
    row_logits = torch.arange(rows, device="cuda")
    params = _params(temperature, keys)
    twin_tokens, twin_logprobs = Sampler(vocab, torch.device("cuda"))(logits, params)
    tokens = torch.empty(rows, dtype=torch.int64, device="cuda")
    logprobs = torch.empty(rows, dtype=torch.float32, device="cuda")
    Sampler(vocab, torch.device("cuda"), use_triton=True).sample_into(
        logits, row_logits, params, tokens, logprobs
    )
    greedy = temperature == 0
    assert torch.equal(tokens[greedy], logits[greedy].float().argmax(-1))
    same = tokens == twin_tokens
    assert same.float().mean().item() >= 0.97  # only near-ties may differ (fast log in the kernel)
    assert torch.allclose(logprobs[same], twin_logprobs[same], atol=1e-4)


def test_triton_sampler_follows_the_distribution() -> None:
    rows, vocab = 40_000, 8
    logits = torch.log(torch.tensor([0.4, 0.2, 0.15, 0.1, 0.07, 0.05, 0.02, 0.01], device="cuda"))
    logits = logits.expand(1, vocab).contiguous()
    keys = torch.from_numpy(
        row_keys(
            np.full(rows, 7, np.uint64), np.zeros(rows, np.uint64), np.arange(rows, dtype=np.uint64)
        )
    ).cuda()
    tokens = torch.empty(rows, dtype=torch.int64, device="cuda")
    logprobs = torch.empty(rows, dtype=torch.float32, device="cuda")
    Sampler(vocab, torch.device("cuda"), use_triton=True).sample_into(
        logits,
        torch.zeros(rows, dtype=torch.int64, device="cuda"),  # every row draws from one logits row
        _params(torch.ones(rows, device="cuda"), keys),
        tokens,
        logprobs,
    )
    freq = torch.bincount(tokens, minlength=vocab).float() / rows
    assert 0.5 * (freq - logits.exp()[0]).abs().sum().item() < 0.02
    assert torch.allclose(logprobs, logits[0, tokens], atol=1e-5)


@pytest.mark.parametrize("rows,vocab", [(1, 9000), (32, 128_256), (300, 151_936)])
def test_split_vocabulary_matches_torch_twin(rows: int, vocab: int) -> None:
    # Row and vocabulary sizes that give 2, 16 and 2 slices per row (some slices empty).
    g = torch.Generator(device="cuda").manual_seed(rows)
    logits = (torch.randn(rows, vocab, device="cuda", generator=g) * 3).to(torch.bfloat16)
    temperature = torch.where(torch.arange(rows, device="cuda") % 3 == 0, 0.0, 1.0)
    keys_host = row_keys(
        np.arange(rows, dtype=np.uint64),
        np.zeros(rows, np.uint64),
        np.arange(rows, dtype=np.uint64),
    )
    params = _params(temperature, torch.from_numpy(keys_host).cuda())
    twin_tokens, twin_logprobs = Sampler(vocab, torch.device("cuda"))(logits, params)
    tokens = torch.empty(rows, dtype=torch.int64, device="cuda")
    logprobs = torch.empty(rows, dtype=torch.float32, device="cuda")
    Sampler(vocab, torch.device("cuda"), use_triton=True).sample_into(
        logits, torch.arange(rows, device="cuda"), params, tokens, logprobs
    )
    same = tokens == twin_tokens
    assert same.float().mean().item() >= 0.97
    assert torch.allclose(logprobs[same], twin_logprobs[same], atol=1e-4)


def test_greedy_ties_across_slices_take_the_lower_token() -> None:
    logits = torch.zeros(2, 70_000, device="cuda")
    logits[0, [5_000, 60_000]] = 1.0
    logits[1, [40_000, 69_999]] = 2.0
    params = _params(
        torch.zeros(2, device="cuda"), torch.zeros(2, dtype=torch.int64, device="cuda")
    )
    tokens = torch.empty(2, dtype=torch.int64, device="cuda")
    logprobs = torch.empty(2, dtype=torch.float32, device="cuda")
    Sampler(70_000, torch.device("cuda"), use_triton=True).sample_into(
        logits, torch.arange(2, device="cuda"), params, tokens, logprobs
    )
    assert tokens.tolist() == [5_000, 40_000]
    expected = torch.log_softmax(logits, -1)[[0, 1], [5_000, 40_000]]
    assert torch.allclose(logprobs, expected, atol=1e-5)
