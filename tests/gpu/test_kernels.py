"""Triton paged-attention kernels against their PyTorch twins, on the GPU."""

from __future__ import annotations

import pytest
import torch

from rollout.kernels import torch_paged_attention as twin
from tests.kernel_cases import make_case

pytestmark = pytest.mark.gpu


def _triton():
    from rollout.kernels import triton_paged_attention

    return triton_paged_attention


def _reference(case):
    return twin.paged_attention(
        case["query"],
        case["k_cache"],
        case["v_cache"],
        case["block_tables"],
        case["query_start_loc_host"],
        case["seq_lens_host"],
        case["scale"],
    )


def _rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


# Lengths around block edges (16), split edges (512) and long contexts, mixed in one batch.
DECODE_LENS = [1, 2, 15, 16, 17, 31, 255, 256, 257, 511, 512, 513, 1000, 4096, 33]


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decode_matches_twin(group: int, head_dim: int, dtype: torch.dtype) -> None:
    case = make_case(
        DECODE_LENS, [1] * len(DECODE_LENS), 2, group, head_dim, 16, dtype, "cuda", seed=group
    )
    got = _triton().decode_attention(
        case["query"],
        case["k_cache"],
        case["v_cache"],
        case["block_tables"],
        case["seq_lens"],
        case["scale"],
        8192,
    )
    assert not torch.isnan(got).any()
    assert _rel_error(got, _reference(case)) < 1e-2


def test_decode_at_a_full_batch_matches_twin() -> None:
    """135 sequences x 2 KV heads fill the launch's target alone: one piece wanted a sequence,
    pieces up to full_batch_split_len."""
    lens = DECODE_LENS * 9
    tiles = _triton().DECODE_TILES
    assert tiles.longest_piece(tiles.splits_per_sequence(len(lens), 2)) > tiles.split_len
    case = make_case(lens, [1] * len(lens), 2, 4, 128, 16, torch.bfloat16, "cuda", seed=11)
    got = _triton().decode_attention(
        case["query"], case["k_cache"], case["v_cache"], case["block_tables"], case["seq_lens"],
        case["scale"], 8192,
    )  # fmt: skip
    assert not torch.isnan(got).any()
    assert _rel_error(got, _reference(case)) < 1e-2


def test_decode_fp32_is_exact_to_rounding() -> None:
    case = make_case(DECODE_LENS, [1] * len(DECODE_LENS), 2, 4, 64, 16, torch.float32, "cuda")
    got = _triton().decode_attention(
        case["query"], case["k_cache"], case["v_cache"], case["block_tables"], case["seq_lens"],
        case["scale"], 4096,
    )  # fmt: skip
    assert torch.allclose(got, _reference(case), atol=1e-4, rtol=1e-4)


def test_decode_padded_rows_are_zero_and_harmless() -> None:
    lens = [17, 0, 300, 0]  # zero-length rows are CUDA-graph padding
    case = make_case([max(n, 1) for n in lens], [1] * 4, 2, 4, 64, 16, torch.bfloat16, "cuda")
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    got = _triton().decode_attention(
        case["query"], case["k_cache"], case["v_cache"], case["block_tables"], seq_lens,
        case["scale"], 512,
    )  # fmt: skip
    want = _reference(case)
    assert torch.all(got[1] == 0) and torch.all(got[3] == 0)
    assert _rel_error(got[[0, 2]], want[[0, 2]]) < 1e-2


def test_decode_in_one_launch_is_stable_across_graph_replays() -> None:
    """The last split of each (sequence, KV head) merges the others' partial results: replaying a
    graph of many launches must give the eager result every time (counters reset, no stale
    reads)."""
    lens = [4096, 600, 513, 1, 2000, 512, 3000, 0] * 4
    case = make_case(
        [max(n, 1) for n in lens], [1] * len(lens), 8, 4, 128, 16, torch.bfloat16, "cuda"
    )
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")

    def run():
        return _triton().decode_attention(
            case["query"], case["k_cache"], case["v_cache"], case["block_tables"], seq_lens,
            case["scale"], 4096,
        )  # fmt: skip

    _assert_replays_equal_eager(run, launches=20, replays=10)


def _assert_replays_equal_eager(run, launches: int, replays: int) -> None:
    """A graph of `launches` calls of `run`, replayed `replays` times, gives the eager result."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # the case was made on the default stream
    with torch.cuda.stream(stream):
        want = run()  # also the warm-up that allocates this stream's counters
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        outs = [run() for _ in range(launches)]
    for _ in range(replays):
        graph.replay()
        torch.cuda.synchronize()
        for got in outs:
            assert torch.equal(got, want)


@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_extend_matches_twin(group: int, head_dim: int) -> None:
    # Whole prefills, chunks starting mid-sequence (also at block edges), and decode rows.
    seq_lens = [1, 64, 65, 300, 17, 1000, 129, 16]
    query_lens = [1, 64, 1, 130, 17, 200, 65, 16]
    case = make_case(seq_lens, query_lens, 2, group, head_dim, 16, torch.bfloat16, "cuda", seed=7)
    got = _triton().extend_attention(
        case["query"], case["k_cache"], case["v_cache"], case["block_tables"],
        case["query_start_loc"], case["seq_lens"], case["q_block_seq"], case["q_block_start"],
        case["scale"],
    )  # fmt: skip
    assert not torch.isnan(got).any()
    assert _rel_error(got, _reference(case)) < 1e-2


def test_extend_fp32_is_exact_to_rounding() -> None:
    case = make_case([5, 70, 200], [5, 3, 130], 2, 2, 64, 16, torch.float32, "cuda", seed=3)
    got = _triton().extend_attention(
        case["query"], case["k_cache"], case["v_cache"], case["block_tables"],
        case["query_start_loc"], case["seq_lens"], case["q_block_seq"], case["q_block_start"],
        case["scale"],
    )  # fmt: skip
    assert torch.allclose(got, _reference(case), atol=1e-4, rtol=1e-4)


def test_write_kv_matches_twin() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    key = torch.randn(50, 8, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    value = torch.randn(50, 8, 128, device="cuda", generator=g, dtype=torch.bfloat16)
    slots = torch.randperm(64 * 16, device="cuda", generator=g)[:50]
    slots[::7] = -1
    caches = [torch.zeros(64, 16, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    twin.write_kv(key, value, caches[0], caches[1], slots)
    _triton().write_kv(key, value, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert caches[2].abs().sum() > 0


# ---- sliding windows, softcap, sinks ----------------------------------------------------------


def _variants(num_heads: int) -> list[dict]:
    """Windows smaller than a page (16), than a split (512), than a context, and larger than
    every context; softcap; sinks; and all three together."""
    sinks = torch.randn(num_heads, generator=torch.Generator().manual_seed(1)).cuda() * 3
    return [
        dict(window=5),
        dict(window=100),
        dict(window=700),
        dict(window=9000),
        dict(softcap=8.0),
        dict(sinks=sinks),
        dict(window=128, sinks=sinks),
        dict(window=300, softcap=20.0, sinks=sinks),
    ]


def _assert_matches_twin(got, want, dtype: torch.dtype, variant: dict) -> None:
    """No NaN; to rounding in fp32, within 1% relative error in bf16/fp16."""
    assert not torch.isnan(got).any(), variant
    if dtype == torch.float32:
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), variant
    else:
        assert _rel_error(got, want) < 1e-2, variant


def _variant_reference(case, variant):
    return twin.paged_attention(
        case["query"], case["k_cache"], case["v_cache"], case["block_tables"],
        case["query_start_loc_host"], case["seq_lens_host"], case["scale"], **variant,
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("group", [1, 8])
def test_decode_variants_match_twin(dtype: torch.dtype, group: int) -> None:
    case = make_case(
        DECODE_LENS, [1] * len(DECODE_LENS), 2, group, 64, 16, dtype, "cuda", seed=group
    )
    for variant in _variants(2 * group):
        got = _triton().decode_attention(
            case["query"], case["k_cache"], case["v_cache"], case["block_tables"],
            case["seq_lens"], case["scale"], 8192, **variant,
        )  # fmt: skip
        _assert_matches_twin(got, _variant_reference(case, variant), dtype, variant)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_extend_variants_match_twin(dtype: torch.dtype) -> None:
    seq_lens = [1, 64, 65, 300, 17, 1000, 129, 16]
    query_lens = [1, 64, 1, 130, 17, 200, 65, 16]
    case = make_case(seq_lens, query_lens, 2, 4, 64, 16, dtype, "cuda", seed=9)
    for variant in _variants(8):
        got = _triton().extend_attention(
            case["query"], case["k_cache"], case["v_cache"], case["block_tables"],
            case["query_start_loc"], case["seq_lens"], case["q_block_seq"],
            case["q_block_start"], case["scale"], **variant,
        )  # fmt: skip
        _assert_matches_twin(got, _variant_reference(case, variant), dtype, variant)


def test_windowed_decode_is_stable_across_graph_replays() -> None:
    lens = [4096, 600, 513, 1, 2000, 512, 3000, 0] * 4
    case = make_case(
        [max(n, 1) for n in lens], [1] * len(lens), 8, 4, 64, 16, torch.bfloat16, "cuda"
    )
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    sinks = torch.randn(32, device="cuda")

    def run():
        return _triton().decode_attention(
            case["query"], case["k_cache"], case["v_cache"], case["block_tables"], seq_lens,
            case["scale"], 4096, window=700, sinks=sinks,
        )  # fmt: skip

    _assert_replays_equal_eager(run, launches=10, replays=5)


@pytest.mark.parametrize(
    ("dtype", "group", "query_len"),
    [(torch.bfloat16, 4, 5), (torch.float32, 4, 5), (torch.float32, 8, 8), (torch.float32, 1, 2)],
)
def test_decode_with_a_few_tokens_per_sequence_matches_twin(
    dtype: torch.dtype, group: int, query_len: int
) -> None:
    """A verification step's layout (the same few tokens per sequence, causal among them)
    through the decode kernel, plain and with the variants, against the twin's extend path."""
    lens = [n for n in DECODE_LENS if n >= query_len]
    case = make_case(lens, [query_len] * len(lens), 2, group, 128, 16, dtype, "cuda", seed=5)
    variants = _variants(2 * group)
    # Plain; a window smaller than a page; window, softcap and sinks together.
    for variant in [{}, variants[0], variants[-1]]:
        got = _triton().decode_attention(
            case["query"], case["k_cache"], case["v_cache"], case["block_tables"],
            case["seq_lens"], case["scale"], 8192, query_len=query_len, **variant,
        )  # fmt: skip
        _assert_matches_twin(got, _variant_reference(case, variant), dtype, variant)


def test_verification_layout_is_stable_across_graph_replays() -> None:
    lens = [4096, 600, 513, 5, 2000, 512, 3000, 0] * 4
    case = make_case(
        [max(n, 5) for n in lens], [5] * len(lens), 8, 4, 128, 16, torch.bfloat16, "cuda"
    )
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")

    def run():
        return _triton().decode_attention(
            case["query"], case["k_cache"], case["v_cache"], case["block_tables"], seq_lens,
            case["scale"], 4096, query_len=5,
        )  # fmt: skip

    _assert_replays_equal_eager(run, launches=10, replays=5)
