"""Sampler on CPU: greedy/temperature logprobs, seeded determinism, batch independence,
distribution, top-k / top-p / min-p filtering, and row_keys."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rollout.engine.execution.sampler import Sampler, SamplingTensors, _mix32
from rollout.engine.sampling_params import SamplingParams
from rollout.engine.scheduling.sample_keys import row_keys, token_keys
from rollout.engine.scheduling.sequence import Sequence

CPU = torch.device("cpu")


def make_params(
    rows: int,
    *,
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    min_p=0.0,
    keys=None,
    seed: int = 0,
) -> SamplingTensors:
    """Per-row tensors from scalars or sequences; keys default to row_keys(seed, 0, row)."""

    def column(value, dtype):
        if isinstance(value, (int, float)):
            value = [value] * rows
        return torch.tensor(list(value), dtype=dtype)

    if keys is None:
        keys = row_keys(
            np.full(rows, seed, dtype=np.int64), np.zeros(rows, dtype=np.int64), np.arange(rows)
        )
    top_k_t = column(top_k, torch.int64)
    top_p_t = column(top_p, torch.float32)
    min_p_t = column(min_p, torch.float32)
    return SamplingTensors(
        temperature=column(temperature, torch.float32),
        top_k=top_k_t,
        top_p=top_p_t,
        min_p=min_p_t,
        keys=torch.as_tensor(np.asarray(keys), dtype=torch.int64),
        needs_sort=bool((top_k_t > 0).any() or (top_p_t < 1).any()),
        needs_min_p=bool((min_p_t > 0).any()),
    )


def draw_keys(n: int, seed: int = 1234) -> np.ndarray:
    """n distinct keys from varied sample indices and output positions (as the engine makes them)."""
    i = np.arange(n, dtype=np.int64)
    return row_keys(np.full(n, seed, dtype=np.int64), i % 7, i // 7)


def sample_many(logits_row: torch.Tensor, n: int, **kwargs) -> torch.Tensor:
    """n draws of one distribution: the row repeated with n different keys."""
    vocab = logits_row.shape[0]
    sampler = Sampler(vocab, CPU)
    tokens, _ = sampler(logits_row.expand(n, vocab), make_params(n, keys=draw_keys(n), **kwargs))
    return tokens


def log_probs(probs) -> torch.Tensor:
    return torch.log(torch.tensor(probs, dtype=torch.float64)).float()


# ---- greedy and logprobs ----------------------------------------------------------------------


def test_greedy_returns_argmax_and_raw_logprob():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=g) * 3
    # Filters and keys do not change a greedy row.
    params = make_params(6, temperature=0.0, top_k=[0, 1, 3, 0, 0, 5], top_p=[1, 1, 1, 0.1, 1, 1])
    tokens, logprobs = Sampler(50, CPU)(logits, params)
    assert torch.equal(tokens, logits.argmax(dim=-1))
    expected = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]
    assert torch.allclose(logprobs, expected, atol=1e-6)
    assert tokens.dtype == torch.int64 and logprobs.dtype == torch.float32


def test_greedy_ignores_keys():
    logits = torch.randn(1, 20, generator=torch.Generator().manual_seed(1)).expand(64, 20)
    tokens, _ = Sampler(20, CPU)(logits, make_params(64, temperature=0.0, keys=draw_keys(64)))
    assert (tokens == logits[0].argmax()).all()


@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.5])
def test_temperature_logprob_is_log_softmax_of_scaled_logits(temperature):
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(200, 32, generator=g) * 2
    tokens, logprobs = Sampler(32, CPU)(logits, make_params(200, temperature=temperature))
    expected = torch.log_softmax(logits / temperature, dim=-1).gather(1, tokens[:, None])[:, 0]
    assert (logprobs - expected).abs().max().item() < 1e-5
    # Sampling, not argmax: with 200 draws at least two distinct tokens come out.
    assert tokens.unique().numel() > 1


def test_logprob_is_before_filtering():
    """top-k / top-p / min-p rows still report log_softmax(logits / T), not the renormalized one."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 16, generator=g)
    params = make_params(
        4, temperature=0.7, top_k=[2, 0, 0, 3], top_p=[1, 0.5, 1, 0.9], min_p=[0, 0, 0.2, 0]
    )
    tokens, logprobs = Sampler(16, CPU)(logits, params)
    expected = torch.log_softmax(logits / 0.7, dim=-1).gather(1, tokens[:, None])[:, 0]
    assert (logprobs - expected).abs().max().item() < 1e-5


def test_half_precision_logits_accepted():
    logits = torch.randn(3, 10, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    tokens, logprobs = Sampler(10, CPU)(logits, make_params(3, temperature=[0.0, 1.0, 0.5]))
    assert tokens[0] == logits[0].float().argmax()
    assert logprobs.dtype == torch.float32
    expected = torch.log_softmax(logits.float() / torch.tensor([[1.0], [1.0], [0.5]]), dim=-1)
    assert torch.allclose(logprobs, expected.gather(1, tokens[:, None])[:, 0], atol=1e-5)


# ---- seeded randomness -------------------------------------------------------------------------


def test_same_keys_same_tokens():
    logits = torch.zeros(500, 16)  # uniform: the noise alone decides
    params = make_params(500, keys=draw_keys(500, seed=5))
    sampler = Sampler(16, CPU)
    first, _ = sampler(logits, params)
    second, _ = Sampler(16, CPU)(logits.clone(), make_params(500, keys=draw_keys(500, seed=5)))
    assert torch.equal(first, second)


def test_different_keys_differ():
    logits = torch.zeros(500, 16)
    sampler = Sampler(16, CPU)
    a, _ = sampler(logits, make_params(500, keys=draw_keys(500, seed=5)))
    b, _ = sampler(logits, make_params(500, keys=draw_keys(500, seed=6)))
    # Independent uniform draws over 16 tokens agree ~1/16 of the time.
    agree = (a == b).float().mean().item()
    assert agree < 0.15
    # Within one call, rows with different keys spread over the whole vocabulary.
    assert a.unique().numel() == 16


def test_token_does_not_depend_on_other_rows():
    g = torch.Generator().manual_seed(7)
    vocab = 40
    logits = torch.randn(6, vocab, generator=g) * 2
    config = dict(
        temperature=[1.0, 0.0, 0.8, 1.3, 1.0, 0.5],
        top_k=[0, 0, 5, 0, 0, 3],
        top_p=[1.0, 1.0, 1.0, 0.7, 1.0, 0.9],
        min_p=[0.0, 0.0, 0.0, 0.0, 0.1, 0.0],
        keys=draw_keys(6, seed=9),
    )
    sampler = Sampler(vocab, CPU)
    batch_tokens, batch_logprobs = sampler(logits, make_params(6, **config))
    for row in range(6):
        alone = {name: [values[row]] for name, values in config.items()}
        tokens, logprobs = sampler(logits[row : row + 1], make_params(1, **alone))
        assert tokens.item() == batch_tokens[row].item(), row
        assert logprobs.item() == pytest.approx(batch_logprobs[row].item(), abs=1e-6)
    # Also with the rows in reverse order.
    reversed_config = {name: list(values)[::-1] for name, values in config.items()}
    rev_tokens, _ = sampler(logits.flip(0), make_params(6, **reversed_config))
    assert torch.equal(rev_tokens.flip(0), batch_tokens)


# ---- distributions -----------------------------------------------------------------------------


def total_variation(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    return 0.5 * (counts / counts.sum() - probs.double()).abs().sum().item()


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.8])
def test_empirical_distribution_matches_softmax(temperature):
    logits = torch.tensor([1.0, 0.2, -0.5, 2.0, 0.0, -1.5, 0.7, 1.2])
    tokens = sample_many(logits, 20000, temperature=temperature)
    expected = torch.softmax(logits / temperature, dim=-1)
    assert total_variation(tokens, expected) < 0.03


def test_empirical_distribution_with_top_k_is_renormalized():
    logits = torch.tensor([1.0, 0.2, -0.5, 2.0, 0.0, -1.5, 0.7, 1.2])
    tokens = sample_many(logits, 20000, top_k=3)
    expected = torch.zeros(8)
    top3 = logits.topk(3).indices
    expected[top3] = torch.softmax(logits[top3], dim=-1)
    assert total_variation(tokens, expected) < 0.03


def test_top_k_two_only_returns_top_two():
    logits = torch.tensor([0.5, 1.9, -1.0, 2.0, 1.8, 0.0, 1.7, -2.0])  # close runners-up
    tokens = sample_many(logits, 5000, top_k=2)
    assert set(tokens.tolist()) == {3, 1}


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [
        (0.3, {2}),  # the top token alone (0.5) already reaches p
        (0.45, {2}),
        (0.7, {2, 0}),  # 0.5 + 0.25
        (0.8, {2, 0, 4}),  # + 0.125
        (0.9, {2, 0, 4, 1}),  # + 0.0625 = 0.9375
        (1.0, {2, 0, 4, 1, 3}),
    ],
)
def test_top_p_keeps_smallest_set_reaching_p(top_p, kept):
    # Probabilities 0.25, 0.0625, 0.5, 0.03125, 0.125 (+ 0.03125 on token 5, never kept below 1).
    probs = [0.25, 0.0625, 0.5, 0.03125, 0.125, 0.03125]
    logits = log_probs(probs)
    tokens = sample_many(logits, 6000, top_p=top_p)
    got = set(tokens.tolist())
    if top_p == 1.0:
        assert got == set(range(6))
    else:
        assert got == kept


def test_top_p_distribution_is_renormalized():
    probs = [0.25, 0.0625, 0.5, 0.03125, 0.125, 0.03125]
    tokens = sample_many(log_probs(probs), 20000, top_p=0.8)
    expected = torch.tensor([0.25, 0.0, 0.5, 0.0, 0.125, 0.0]) / 0.875
    assert total_variation(tokens, expected) < 0.03


@pytest.mark.parametrize(
    ("min_p", "kept"),
    [
        (0.3, {0, 1, 2}),  # floor 0.12: drops 0.1 and 0.05
        (0.2, {0, 1, 2, 3}),  # floor 0.08
        (0.5, {0, 1}),  # floor 0.2
        (0.9, {0}),  # floor 0.36
    ],
)
def test_min_p_drops_tokens_below_fraction_of_max(min_p, kept):
    probs = [0.4, 0.3, 0.15, 0.1, 0.05]
    perm = [3, 0, 4, 2, 1]  # token ids in shuffled order
    logits = torch.empty(5)
    logits[perm] = log_probs(probs)
    tokens = sample_many(logits, 6000, min_p=min_p)
    assert set(tokens.tolist()) == {perm[i] for i in kept}


def test_min_p_applies_after_temperature():
    # At T=2 the probabilities flatten: token 1 has p ~ 0.32 of the max, above min_p = 0.25,
    # while at T=1 it has 0.1 of the max and would be dropped.
    logits = log_probs([0.5, 0.05, 0.45])
    assert set(sample_many(logits, 3000, min_p=0.25, temperature=1.0).tolist()) == {0, 2}
    assert set(sample_many(logits, 3000, min_p=0.25, temperature=2.0).tolist()) == {0, 1, 2}


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(top_k=1),
        dict(top_p=1e-6),
        dict(min_p=1.0),
        dict(top_k=1, top_p=1e-6, min_p=1.0),
        dict(top_p=1e-6, temperature=5.0),
    ],
)
def test_most_likely_token_always_kept(kwargs):
    # Nearly flat logits: the top token has probability ~1/32, far below any p.
    logits = torch.randn(32, generator=torch.Generator().manual_seed(11)) * 0.01
    tokens = sample_many(logits, 2000, **kwargs)
    assert (tokens == logits.argmax()).all()


def test_filters_per_row():
    """One batch mixes rows with and without filters; each keeps its own support."""
    logits = torch.tensor([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
    n = 3000
    rows = torch.cat([logits.expand(n, 8), logits.expand(n, 8)])
    params = make_params(2 * n, top_k=[2] * n + [0] * n, keys=draw_keys(2 * n))
    tokens, _ = Sampler(8, CPU)(rows, params)
    assert set(tokens[:n].tolist()) == {6, 7}
    assert set(tokens[n:].tolist()) == set(range(8))


# ---- row keys ----------------------------------------------------------------------------------


def test_row_keys_distinct_across_seed_index_position():
    seeds, indices, positions = np.meshgrid(
        np.array([0, 1, 2, 12345, 2**32, 2**32 + 7, 2**62], dtype=np.int64),
        np.arange(6, dtype=np.int64),
        np.arange(50, dtype=np.int64),
        indexing="ij",
    )
    keys = row_keys(seeds.ravel(), indices.ravel(), positions.ravel())
    assert keys.dtype == np.int64
    assert ((keys >= 0) & (keys < 2**32)).all()
    assert np.unique(keys).size == keys.size
    # Deterministic.
    assert np.array_equal(keys, row_keys(seeds.ravel(), indices.ravel(), positions.ravel()))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ((1, 0, 0), (2, 0, 0)),  # seed
        ((1, 0, 0), (1 + 2**32, 0, 0)),  # high bits of the seed count
        ((1, 0, 0), (1, 1, 0)),  # sample index
        ((1, 0, 0), (1, 0, 1)),  # output position
        ((1, 1, 0), (1, 0, 1)),  # index and position are not interchangeable
        ((0, 0, 0), (0, 0, 1)),
    ],
)
def test_row_keys_differ(a, b):
    ka = row_keys(*(np.array([v], dtype=np.int64) for v in a))
    kb = row_keys(*(np.array([v], dtype=np.int64) for v in b))
    assert ka[0] != kb[0]


@pytest.mark.parametrize(("seed_a", "seed_b"), [(2, 2**32 + 1), (5 * 2**32 + 9, 8 * 2**32 + 6)])
def test_row_keys_seed_halves_not_interchangeable(seed_a, seed_b):
    idx = np.arange(4, dtype=np.int64)
    ka = row_keys(np.full(4, seed_a, dtype=np.int64), idx, idx)
    kb = row_keys(np.full(4, seed_b, dtype=np.int64), idx, idx)
    assert not np.array_equal(ka, kb)


def test_row_keys_elementwise():
    """A row's key depends only on its own (seed, index, position), not on its neighbours."""
    seeds = np.array([3, 4, 5], dtype=np.int64)
    idx = np.array([0, 2, 1], dtype=np.int64)
    pos = np.array([10, 0, 7], dtype=np.int64)
    together = row_keys(seeds, idx, pos)
    for i in range(3):
        assert row_keys(seeds[i : i + 1], idx[i : i + 1], pos[i : i + 1])[0] == together[i]


# ---- Gumbel noise edge ---------------------------------------------------------------------------


def _unmix32(y: int) -> int:
    """Inverse of _mix32 on one 32-bit value."""
    m = 0xFFFFFFFF
    y ^= y >> 16
    y = (y * pow(0x5BD1E995, -1, 2**32)) & m
    y ^= (y >> 15) ^ (y >> 30)
    y = (y * pow(0x7FEB352D, -1, 2**32)) & m
    return y ^ (y >> 16)


def _key_with_top_noise_bits(sampler: Sampler, vocab_index: int) -> int:
    """A row key whose hash at vocab_index has its top 24 bits all set (bits >> 8 == 2^24 - 1)."""
    target = 0xFFFFFF00 | 0x5A
    return _unmix32(target) ^ int(sampler.vocab_hash[vocab_index])


def test_key_construction_for_noise_edge():
    sampler = Sampler(8, CPU)
    key = _key_with_top_noise_bits(sampler, 5)
    assert 0 <= key < 2**32
    bits = _mix32(torch.tensor([key]) ^ sampler.vocab_hash)
    assert (bits[5] >> 8).item() == 2**24 - 1
    assert ((bits >> 8) < 2**24).all()


@pytest.mark.parametrize("top_k", [0, 1])
def test_noise_never_overrides_a_hopeless_token(top_k):
    sampler = Sampler(8, CPU)
    key = _key_with_top_noise_bits(sampler, 5)
    logits = torch.zeros(1, 8)
    logits[0, 0] = 10.0
    logits[0, 5] = -1e4  # probability ~ exp(-1e4): never a fair draw
    tokens, logprobs = sampler(logits, make_params(1, top_k=top_k, keys=[key]))
    assert tokens.item() != 5
    assert math.isfinite(logprobs.item()) and logprobs.item() > -100


# (seed, sample index, output position) -> key, as the engine has always hashed them: a seed must
# keep giving the same tokens from one version to the next.
KNOWN_KEYS = [
    (11749869230777074271, 13, 36716, 229210000),
    (755828109848996025, 31, 11180, 4140253389),
    (0, 26, 37801, 3358161593),
    (1, 62, 5472, 280555223),
    (4294967295, 41, 20467, 2038163021),
    (4294967296, 3, 4024, 2153168640),
    (18446744073709551615, 50, 25813, 2543878762),
]


def test_row_keys_are_the_known_ones_and_a_sample_key_is_their_fixed_part():
    columns = zip(*KNOWN_KEYS, strict=True)
    seeds, indices, positions, expected = (np.array(c, dtype=np.uint64) for c in columns)
    assert row_keys(seeds, indices, positions).tolist() == expected.astype(np.int64).tolist()
    params = SamplingParams(max_tokens=4)
    sequences = [
        Sequence(0, "r", 0, params, int(seed), int(index), [1, 2], arrival=0)
        for seed, index in zip(seeds, indices, strict=True)
    ]
    held = np.array([s.sample_key for s in sequences], dtype=np.uint64)
    assert token_keys(held, positions).tolist() == expected.astype(np.int64).tolist()
