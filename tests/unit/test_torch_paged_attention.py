"""The reference paged attention against dense causal attention computed directly, and write_kv."""

from __future__ import annotations

import math

import pytest
import torch

from rollout.kernels.torch_paged_attention import paged_attention, write_kv


def dense_attention(q, k, v, scale, window=None, softcap=None, sinks=None):
    """q [Q, H, D] = the last Q positions of a context k, v [L, Hkv, D]; plain softmax attention
    in fp64 over the contiguous context, with a lower-triangular mask shifted to the bottom right
    (and a band of `window` positions, capped logits, sink logits, written out one by one)."""
    num_queries, num_heads, _ = q.shape
    seq_len, num_kv_heads, _ = k.shape
    kv_head = torch.arange(num_heads) // (num_heads // num_kv_heads)  # query head -> kv head
    k = k.double()[:, kv_head]  # [L, H, D]
    v = v.double()[:, kv_head]
    scores = torch.einsum("qhd,lhd->hql", q.double(), k) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    visible = torch.ones(num_queries, seq_len, dtype=torch.bool).tril(seq_len - num_queries)
    if window is not None:
        visible &= ~torch.ones(num_queries, seq_len, dtype=torch.bool).tril(
            seq_len - num_queries - window
        )
    scores = scores.masked_fill(~visible, float("-inf"))
    weights = torch.exp(scores - scores.amax(-1, keepdim=True))
    denom = weights.sum(-1, keepdim=True)
    if sinks is not None:
        denom = denom + torch.exp(sinks.double()[:, None, None] - scores.amax(-1, keepdim=True))
    return torch.einsum("hql,lhd->qhd", weights / denom, v)


def build_case(seqs, num_heads, num_kv_heads, head_dim, block_size, seed):
    """Random contexts in a paged cache with shuffled block ids; garbage everywhere else.

    seqs: (seq_len, num_queries) per sequence. Returns the paged inputs and the dense reference.
    """
    g = torch.Generator().manual_seed(seed)
    pages_per_seq = [math.ceil(seq_len / block_size) for seq_len, _ in seqs]
    num_blocks = sum(pages_per_seq) + 3  # a few blocks nobody owns
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g) * 50
    v_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, generator=g) * 50
    perm = torch.randperm(num_blocks, generator=g)
    max_pages = max(pages_per_seq) + 2
    # Padding entries point at a real (garbage) block: they must not be read.
    block_tables = torch.full((len(seqs), max_pages), int(perm[-1]), dtype=torch.int32)
    queries, references, query_start_loc = [], [], [0]
    next_block = 0
    for s, (seq_len, num_queries) in enumerate(seqs):
        blocks = perm[next_block : next_block + pages_per_seq[s]]
        next_block += pages_per_seq[s]
        block_tables[s, : len(blocks)] = blocks.to(torch.int32)
        k = torch.randn(seq_len, num_kv_heads, head_dim, generator=g)
        v = torch.randn(seq_len, num_kv_heads, head_dim, generator=g)
        pos = torch.arange(seq_len)
        k_cache[blocks[pos // block_size], pos % block_size] = k
        v_cache[blocks[pos // block_size], pos % block_size] = v
        q = torch.randn(num_queries, num_heads, head_dim, generator=g)
        queries.append(q)
        references.append((q, k, v))
        query_start_loc.append(query_start_loc[-1] + num_queries)
    query = torch.cat(queries)
    seq_lens = [seq_len for seq_len, _ in seqs]
    return query, k_cache, v_cache, block_tables, query_start_loc, seq_lens, references


def mixed_seqs(block_size):
    """(seq_len, num_queries): decode rows, full prefills, and chunks starting mid-sequence."""
    b = block_size
    return [
        (1, 1),  # first token of a sequence
        (b, 1),  # decode, context exactly one block
        (b + 1, 1),  # decode, first slot of a new block
        (2 * b, 2 * b),  # whole prefill, ends at a block edge
        (2 * b + 3, 5),  # chunk in the middle of the third block
        (3 * b, b),  # chunk that is exactly the last block
        (3 * b - 1, b + 2),  # chunk straddling two block edges
        (37, 1),
        (b + 5, b + 5),  # whole prefill, ends mid-block
        (4 * b + 1, 3),  # chunk starting mid-block, ending one past an edge
    ]


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("head_dim", [16, 32])
@pytest.mark.parametrize("group", [1, 2, 4])
def test_matches_dense_causal_attention(group, head_dim, block_size):
    num_kv_heads = 2
    num_heads = num_kv_heads * group
    seqs = mixed_seqs(block_size)
    seed = group * 100 + head_dim + block_size
    query, k_cache, v_cache, tables, qsl, seq_lens, refs = build_case(
        seqs, num_heads, num_kv_heads, head_dim, block_size, seed
    )
    scale = head_dim**-0.5
    out = paged_attention(query, k_cache, v_cache, tables, qsl, seq_lens, scale)
    assert out.shape == query.shape and out.dtype == torch.float32
    for s, (q, k, v) in enumerate(refs):
        expected = dense_attention(q, k, v, scale)
        got = out[qsl[s] : qsl[s + 1]].double()
        assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5), (s, seqs[s])


@pytest.mark.parametrize(
    "variant",
    [
        dict(window=1),
        dict(window=5),
        dict(window=64),  # wider than every context: the same as no window
        dict(softcap=2.0),
        dict(sinks=True),
        dict(window=6, softcap=3.0, sinks=True),
    ],
    ids=lambda v: "-".join(f"{k}={v[k]}" for k in v),
)
@pytest.mark.parametrize("decode_only", [False, True])
def test_window_softcap_and_sinks_match_dense(variant: dict, decode_only: bool) -> None:
    """Both the per-sequence and the batched decode path, against the dense fp64 reference."""
    block_size, num_kv_heads, group = 4, 2, 2
    seqs = [(n, 1) for n in (1, 3, 4, 9, 17, 30)] if decode_only else mixed_seqs(block_size)
    query, k_cache, v_cache, tables, qsl, seq_lens, refs = build_case(
        seqs, num_kv_heads * group, num_kv_heads, 16, block_size, seed=11
    )
    options = dict(variant)
    if options.pop("sinks", False):
        options["sinks"] = torch.randn(num_kv_heads * group, generator=torch.Generator()) * 2
    out = paged_attention(query, k_cache, v_cache, tables, qsl, seq_lens, 0.25, **options)
    for s, (q, k, v) in enumerate(refs):
        expected = dense_attention(q, k, v, 0.25, **options)
        got = out[qsl[s] : qsl[s + 1]].double()
        assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5), (s, seqs[s])
    plain = paged_attention(query, k_cache, v_cache, tables, qsl, seq_lens, 0.25)
    differs = not torch.allclose(out, plain, atol=1e-5)
    assert differs == (variant != dict(window=64)), "each variant changes the result"


def test_window_sees_exactly_the_last_positions():
    """Uniform scores: a query at position p averages the values of p - window + 1 .. p."""
    head_dim, block_size, window = 8, 4, 3
    seq_len, num_queries = 10, 4
    k_cache = torch.zeros(3, block_size, 1, head_dim)
    v_cache = torch.zeros(3, block_size, 1, head_dim)
    for pos in range(seq_len):
        v_cache[pos // block_size, pos % block_size, 0, 0] = float(pos)
    query = torch.randn(num_queries, 1, head_dim, generator=torch.Generator().manual_seed(2))
    tables = torch.tensor([[0, 1, 2]], dtype=torch.int32)
    out = paged_attention(query, k_cache, v_cache, tables, [0, 4], [seq_len], 1.0, window=window)
    expected = torch.tensor([(p + p - 1 + p - 2) / 3 for p in (6, 7, 8, 9)])
    assert torch.allclose(out[:, 0, 0], expected, atol=1e-6)


def test_gqa_head_mapping_is_grouped_not_interleaved():
    """Query head h reads kv head h // group: kv heads carry distinct constant values."""
    num_heads, num_kv_heads, head_dim, block_size = 8, 2, 16, 4
    k_cache = torch.zeros(2, block_size, num_kv_heads, head_dim)
    v_cache = torch.zeros(2, block_size, num_kv_heads, head_dim)
    v_cache[:, :, 0] = 1.0
    v_cache[:, :, 1] = 2.0
    query = torch.randn(3, num_heads, head_dim, generator=torch.Generator().manual_seed(0))
    tables = torch.tensor([[1, 0]], dtype=torch.int32)
    out = paged_attention(query, k_cache, v_cache, tables, [0, 3], [6], 0.25)
    expected = torch.tensor([1.0] * 4 + [2.0] * 4)
    assert torch.allclose(out[:, :, 0], expected.expand(3, 8))


def test_causal_mask_is_bottom_right_aligned():
    """A chunk's first query sees exactly the earlier context plus itself, not the later queries."""
    head_dim, block_size = 16, 4
    seq_len, num_queries = 10, 3
    k_cache = torch.zeros(3, block_size, 1, head_dim)  # all scores equal: uniform attention
    v_cache = torch.zeros(3, block_size, 1, head_dim)
    for pos in range(seq_len):
        v_cache[pos // block_size, pos % block_size, 0, 0] = float(pos)
    query = torch.randn(num_queries, 1, head_dim, generator=torch.Generator().manual_seed(1))
    tables = torch.tensor([[0, 1, 2]], dtype=torch.int32)
    out = paged_attention(query, k_cache, v_cache, tables, [0, 3], [seq_len], 1.0)
    # Query i sits at position 7 + i and averages values 0 .. 7 + i.
    expected = torch.tensor([sum(range(p + 1)) / (p + 1) for p in (7, 8, 9)])
    assert torch.allclose(out[:, 0, 0], expected, atol=1e-6)


def test_scale_is_applied():
    query, k_cache, v_cache, tables, qsl, seq_lens, refs = build_case(
        [(9, 4), (5, 1)], 4, 2, 16, 4, seed=3
    )
    out_a = paged_attention(query, k_cache, v_cache, tables, qsl, seq_lens, 0.7)
    out_b = paged_attention(query, k_cache, v_cache, tables, qsl, seq_lens, 0.1)
    for s, (q, k, v) in enumerate(refs):
        assert torch.allclose(
            out_a[qsl[s] : qsl[s + 1]].double(), dense_attention(q, k, v, 0.7), atol=1e-5
        )
        assert torch.allclose(
            out_b[qsl[s] : qsl[s + 1]].double(), dense_attention(q, k, v, 0.1), atol=1e-5
        )
    assert not torch.allclose(out_a, out_b)


def test_sequence_with_no_queries_is_skipped():
    query, k_cache, v_cache, tables, qsl, seq_lens, refs = build_case(
        [(6, 2), (8, 0), (5, 1)], 2, 1, 16, 4, seed=4
    )
    assert qsl == [0, 2, 2, 3]
    out = paged_attention(query, k_cache, v_cache, tables, qsl, seq_lens, 0.25)
    assert out.shape == (3, 2, 16)
    assert torch.allclose(out[0:2].double(), dense_attention(*refs[0][:3], 0.25), atol=1e-5)
    assert torch.allclose(out[2:3].double(), dense_attention(*refs[2][:3], 0.25), atol=1e-5)


def test_paged_result_matches_after_write_kv():
    """Prefill chunk then decode through write_kv: same as dense attention over the whole context."""
    g = torch.Generator().manual_seed(5)
    num_heads, num_kv_heads, head_dim, block_size = 4, 2, 16, 4
    k_cache = torch.full((6, block_size, num_kv_heads, head_dim), float("nan"))
    v_cache = torch.full((6, block_size, num_kv_heads, head_dim), float("nan"))
    blocks = [4, 1, 5]
    tables = torch.tensor([blocks], dtype=torch.int32)
    seq_len = 10
    k = torch.randn(seq_len, num_kv_heads, head_dim, generator=g)
    v = torch.randn(seq_len, num_kv_heads, head_dim, generator=g)
    q = torch.randn(seq_len, num_heads, head_dim, generator=g)
    slots = torch.tensor([blocks[p // block_size] * block_size + p % block_size for p in range(10)])
    outs = []
    for start, end in [(0, 6), (6, 9), (9, 10)]:  # two prefill chunks, then a decode
        write_kv(k[start:end], v[start:end], k_cache, v_cache, slots[start:end])
        outs.append(
            paged_attention(q[start:end], k_cache, v_cache, tables, [0, end - start], [end], 0.25)
        )
    expected = dense_attention(q, k, v, 0.25)
    assert torch.allclose(torch.cat(outs).double(), expected, atol=1e-5)


# ---- write_kv -----------------------------------------------------------------------------------


def test_write_kv_writes_exactly_given_slots_and_skips_negative():
    g = torch.Generator().manual_seed(6)
    num_blocks, block_size, num_kv_heads, head_dim = 5, 4, 2, 8
    sentinel = -7.0
    k_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), sentinel)
    v_cache = torch.full((num_blocks, block_size, num_kv_heads, head_dim), sentinel)
    slot_mapping = torch.tensor([13, -1, 0, 19, -1, 6], dtype=torch.int64)
    key = torch.randn(6, num_kv_heads, head_dim, generator=g)
    value = torch.randn(6, num_kv_heads, head_dim, generator=g)
    write_kv(key, value, k_cache, v_cache, slot_mapping)
    written = set()
    for i, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        written.add(slot)
        assert torch.equal(k_cache[slot // block_size, slot % block_size], key[i])
        assert torch.equal(v_cache[slot // block_size, slot % block_size], value[i])
    for slot in range(num_blocks * block_size):
        if slot not in written:
            assert (k_cache[slot // block_size, slot % block_size] == sentinel).all(), slot
            assert (v_cache[slot // block_size, slot % block_size] == sentinel).all(), slot
    # The skipped rows' data is nowhere in the cache.
    for i in (1, 4):
        assert not (k_cache == key[i][None, None]).all(dim=(-1, -2)).any()


def test_write_kv_all_skipped_changes_nothing():
    k_cache = torch.zeros(2, 4, 1, 8)
    v_cache = torch.zeros(2, 4, 1, 8)
    write_kv(torch.ones(3, 1, 8), torch.ones(3, 1, 8), k_cache, v_cache, torch.tensor([-1, -1, -1]))
    assert (k_cache == 0).all() and (v_cache == 0).all()


def test_write_kv_casts_to_cache_dtype():
    k_cache = torch.zeros(2, 4, 1, 8, dtype=torch.bfloat16)
    v_cache = torch.zeros(2, 4, 1, 8, dtype=torch.bfloat16)
    key = torch.randn(2, 1, 8, generator=torch.Generator().manual_seed(7))
    value = key * 3
    write_kv(key, value, k_cache, v_cache, torch.tensor([5, 2]))
    assert k_cache.dtype == torch.bfloat16
    assert torch.equal(k_cache[1, 1], key[0].to(torch.bfloat16))
    assert torch.equal(v_cache[0, 2], value[1].to(torch.bfloat16))


@pytest.mark.parametrize("by_token", [False, True])
def test_stale_slots_past_a_context_do_not_reach_it(by_token: bool) -> None:
    """Decode (batched) and prefill read pages whose slots past the context hold what another
    sequence left there, NaN and infinities included; the result is the clean cache's, in either
    V layout (an FP8 cache holds V by token, `v_by_token`)."""
    from rollout.kernels.torch_paged_attention import v_by_token

    g = torch.Generator().manual_seed(0)
    seq_lens, block_size = [5, 19, 1], 8
    k_cache = torch.randn(9, block_size, 2, 16, generator=g)
    v_cache = torch.randn(9, block_size, 2, 16, generator=g)
    block_tables = torch.tensor([[4, 0, 0], [1, 7, 2], [8, 0, 0]], dtype=torch.int32)
    query = torch.randn(3, 4, 16, generator=g)
    clean = paged_attention(query, k_cache, v_cache, block_tables, [0, 1, 2, 3], seq_lens, 0.25)
    # one sequence: the prefill path, whose sums may round apart from the batched decode's
    clean_one = paged_attention(query[1:2], k_cache, v_cache, block_tables[1:2], [0, 1], [19], 0.25)
    for s, n in enumerate(seq_lens):
        last = block_tables[s, (n - 1) // block_size]
        k_cache[last, (n - 1) % block_size + 1 :] = float("nan")
        v_cache[last, (n - 1) % block_size + 1 :] = float("inf")
    v_cache[0] = float("nan")  # the page the short sequences' table rows are padded with
    if by_token:
        v_cache = v_by_token(v_cache)
    got = paged_attention(query, k_cache, v_cache, block_tables, [0, 1, 2, 3], seq_lens, 0.25)
    torch.testing.assert_close(got, clean, rtol=0, atol=0)
    one = paged_attention(query[1:2], k_cache, v_cache, block_tables[1:2], [0, 1], [19], 0.25)
    torch.testing.assert_close(one, clean_one, rtol=0, atol=0)
