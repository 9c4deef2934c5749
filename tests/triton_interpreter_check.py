"""Run under TRITON_INTERPRET=1 (tests/unit/test_triton_interpreter.py does): the Triton kernels'
logic against their PyTorch twins on CPU, fp32. Prints one line per check; exits non-zero on a
mismatch."""

from __future__ import annotations

import os
import sys

import torch
import triton.runtime.interpreter as interpreter

from rollout.kernels import torch_moe, triton_expert_sort, triton_linear, triton_moe, triton_routing
from rollout.kernels import torch_paged_attention as twin
from rollout.kernels import triton_paged_attention as kernels
from tests.kernel_cases import make_case, with_fp8_cache, with_nan_leftovers
from tests.triton_launches import record_launches

# triton 3.6's interpreter turns its 1-element scalar arrays into Python ints with int(array),
# which numpy >= 2.3 refuses for 1-d arrays; index through the single element instead.
_patch_lang_tensor = interpreter._patch_lang_tensor


def _patched(tensor, scope):
    _patch_lang_tensor(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))


interpreter._patch_lang_tensor = _patched

if os.environ.get("ROLLOUT_TRITON_LAUNCHES"):  # noted for tests/triton_launches.py to compile
    record_launches(os.environ["ROLLOUT_TRITON_LAUNCHES"])


def _reference(case, **variant):
    return twin.paged_attention(
        case["query"], case["k_cache"], case["v_cache"], case["block_tables"],
        case["query_start_loc_host"], case["seq_lens_host"], case["scale"], **variant,
    )  # fmt: skip


def _variants(num_heads: int) -> list[dict]:
    """Sliding windows smaller and larger than a page and a split, softcap, sinks, together."""
    sinks = torch.randn(num_heads, generator=torch.Generator().manual_seed(3)) * 3
    return [
        dict(window=7),
        dict(window=300),
        dict(window=700, softcap=5.0),
        dict(softcap=2.0),
        dict(sinks=sinks),
        dict(window=40, softcap=3.0, sinks=sinks),
    ]


def check_variants() -> float:
    """Decode (several splits: the window's first split is not split 0) and extend."""
    worst = 0.0
    decode = make_case([1, 17, 600, 1000, 513], [1] * 5, 2, 4, 64, 16, torch.float32, "cpu")
    extend = make_case([70, 5, 130, 300], [70, 1, 65, 1], 2, 4, 64, 16, torch.float32, "cpu")
    for variant in _variants(8):
        got = kernels.decode_attention(
            decode["query"], decode["k_cache"], decode["v_cache"], decode["block_tables"],
            decode["seq_lens"], decode["scale"], 1024,
            kernels.DecodeTiles(split_len=256, block_n=64), **variant,
        )  # fmt: skip
        worst = max(worst, _error(got, _reference(decode, **variant)))
        got = kernels.extend_attention(
            extend["query"], extend["k_cache"], extend["v_cache"], extend["block_tables"],
            extend["query_start_loc"], extend["seq_lens"], extend["q_block_seq"],
            extend["q_block_start"], extend["scale"], **variant,
        )  # fmt: skip
        worst = max(worst, _error(got, _reference(extend, **variant)))
    return worst


def check_decode() -> float:
    worst = 0.0
    # Lengths around page (16) and split (512) edges, several splits, and zero-length padding.
    lens = [1, 17, 511, 513, 600, 0, 1000, 512]
    live = [i for i, n in enumerate(lens) if n]
    for group, head_dim in [(1, 64), (4, 128), (8, 64)]:
        case = make_case(
            [max(n, 1) for n in lens], [1] * len(lens), 2, group, head_dim, 16, torch.float32,
            "cpu", seed=group,
        )  # fmt: skip
        seq_lens = torch.tensor(lens, dtype=torch.int32)
        want = _reference(case)
        for _ in range(2):  # a second launch must find the arrival counters reset
            got = kernels.decode_attention(
                case["query"], case["k_cache"], case["v_cache"], case["block_tables"], seq_lens,
                case["scale"], 1024,
            )  # fmt: skip
            assert torch.all(got[5] == 0), "a padded row must come out as zeros"
            worst = max(worst, _error(got[live], want[live]))
    # More pieces than one merge chunk: 71 of 64 tokens (a small batch cuts short pieces), and
    # 18 of 256 with the pieces' length fixed (target_programs=0), merged 8 at a time (4 rows,
    # 32 pairs a load), then one at a time.
    case = make_case([4500, 10], [1, 1], 1, 4, 64, 16, torch.float32, "cpu", seed=7)
    want = _reference(case)
    for target, pairs in ((1024, 32), (0, 32), (1024, 4)):
        got = kernels.decode_attention(
            case["query"], case["k_cache"], case["v_cache"], case["block_tables"],
            case["seq_lens"], case["scale"], 8192,
            kernels.DecodeTiles(split_len=256, block_n=64, target_programs=target,
                                merge_pairs=pairs),
        )  # fmt: skip
        worst = max(worst, _error(got, want))
    # A batch that fills the target alone (one piece wanted a sequence): pieces up to
    # full_batch_split_len, 9 of 512 for the long context.
    got = kernels.decode_attention(
        case["query"], case["k_cache"], case["v_cache"], case["block_tables"], case["seq_lens"],
        case["scale"], 8192,
        kernels.DecodeTiles(split_len=256, block_n=64, target_programs=2,
                            full_batch_split_len=512),
    )  # fmt: skip
    worst = max(worst, _error(got, want))
    # A context past the static maximum the grid was sized for still reads every position.
    got = kernels.decode_attention(
        case["query"], case["k_cache"], case["v_cache"], case["block_tables"], case["seq_lens"],
        case["scale"], 1024, kernels.DecodeTiles(split_len=256, block_n=64),
    )  # fmt: skip
    return max(worst, _error(got, want))


def check_verification() -> float:
    """The same few query tokens for every sequence (a verification step's graph layout) through
    the decode kernel: causal among them, with the variants, against the twin's extend path."""
    worst = 0.0
    lens = [5, 17, 600, 1000, 130]
    for query_len in (2, 5):
        case = make_case(lens, [query_len] * len(lens), 2, 4, 64, 16, torch.float32, "cpu",
                         seed=query_len)  # fmt: skip
        for variant in [{}, *_variants(8)]:
            for tiles in (None, kernels.DecodeTiles(split_len=256, block_n=64)):
                got = kernels.decode_attention(
                    case["query"], case["k_cache"], case["v_cache"], case["block_tables"],
                    case["seq_lens"], case["scale"], 1024, tiles, query_len=query_len, **variant,
                )  # fmt: skip
                worst = max(worst, _error(got, _reference(case, **variant)))
    # A padded sequence (no context) comes out as zeros beside real ones.
    case = make_case([40, 3], [3, 3], 2, 4, 64, 16, torch.float32, "cpu")
    seq_lens = torch.tensor([40, 0], dtype=torch.int32)
    got = kernels.decode_attention(
        case["query"], case["k_cache"], case["v_cache"], case["block_tables"], seq_lens,
        case["scale"], 1024, query_len=3,
    )  # fmt: skip
    assert torch.all(got[3:] == 0), "a padded sequence's rows must come out as zeros"
    return max(worst, _error(got[:3], _reference(case)[:3]))


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest absolute difference; inf when either side has a NaN (max() would drop it)."""
    if torch.isnan(got).any() or torch.isnan(want).any():
        return float("inf")
    return (got - want).abs().max().item()


def check_extend() -> float:
    # Chunks at any start, longer than a q-block, mixed with decode rows.
    case = make_case([70, 5, 130, 300], [70, 1, 65, 1], 2, 4, 64, 16, torch.float32, "cpu")
    got = kernels.extend_attention(
        case["query"], case["k_cache"], case["v_cache"], case["block_tables"],
        case["query_start_loc"], case["seq_lens"], case["q_block_seq"], case["q_block_start"],
        case["scale"],
    )  # fmt: skip
    return _error(got, _reference(case))


def check_write_kv() -> float:
    g = torch.Generator().manual_seed(0)
    key, value = torch.randn(5, 2, 64, generator=g), torch.randn(5, 2, 64, generator=g)
    slots = torch.tensor([3, -1, 17, 40, 0], dtype=torch.int32)  # -1: a padded token, skipped
    caches = [torch.zeros(4, 16, 2, 64) for _ in range(4)]
    kernels.write_kv(key, value, caches[0], caches[1], slots)
    twin.write_kv(key, value, caches[2], caches[3], slots)
    return max(
        (caches[0] - caches[2]).abs().max().item(), (caches[1] - caches[3]).abs().max().item()
    )


def check_fp8_kv() -> float:
    """An FP8 cache: the KV write stores the twin's very bytes and scales (a zero row, rows of
    very different sizes, a skipped slot), V laid out by token and the scales head by head as
    the engine holds them; decode (several splits, a window) and extend read it as the twin
    does, V by token (scales by head) or by dim (scales by slot), with NaN bytes past every
    context that must not get through."""
    from rollout.kernels.torch_fp8 import FP8_DTYPE

    g = torch.Generator().manual_seed(0)
    key = torch.randn(6, 2, 64, generator=g) * torch.logspace(-4, 3, 6)[:, None, None]
    value = torch.randn(6, 2, 64, generator=g) * 7
    key[2, 1] = 0.0
    slots = torch.tensor([3, -1, 17, 40, 0, 63], dtype=torch.int32)
    caches = [torch.zeros(4, 16, 2, 64, dtype=FP8_DTYPE) for _ in range(4)]
    caches[1], caches[3] = twin.v_by_token(caches[1]), twin.v_by_token(caches[3])
    caches[0] = twin.keys_by_head(caches[0])
    scales = [torch.ones(4, 16, 2) for _ in range(4)]
    scales[0], scales[1] = twin.scales_by_head(scales[0]), twin.scales_by_head(scales[1])
    kernels.write_kv(key, value, caches[0], caches[1], slots, scales[0], scales[1])
    twin.write_kv(key, value, caches[2], caches[3], slots, scales[2], scales[3])
    for a, b in ((0, 2), (1, 3)):
        if not torch.equal(caches[a].view(torch.uint8), caches[b].view(torch.uint8)):
            return float("inf")
        if not torch.equal(scales[a], scales[b]):
            return float("inf")
    # Every e4m3 value, the midpoints between neighbours (ties to even) and a little either side,
    # both signs, in rows whose largest value is 448 (scale 1): the bytes of torch's cast.
    codes = torch.arange(0, 127, dtype=torch.uint8).view(FP8_DTYPE).float()  # 0 .. 448
    mids = (codes[1:] + codes[:-1]) / 2
    values = torch.cat([codes, mids, mids * (1 + 2**-12), mids * (1 - 2**-12)])
    values = torch.cat([values, -values])
    rows = -(-values.numel() // 63)
    table = torch.zeros(rows * 63)
    table[: values.numel()] = values
    table = torch.cat([torch.full((rows, 1), 448.0), table.view(rows, 63)], dim=1)[:, None, :]
    slots = torch.arange(rows, dtype=torch.int32)
    fp8 = [torch.zeros(rows, 1, 1, 64, dtype=FP8_DTYPE) for _ in range(2)]
    ones = [torch.ones(rows, 1, 1) for _ in range(2)]
    kernels.write_kv(table, table, fp8[0], fp8[1], slots, ones[0], ones[1])
    if not torch.equal(
        fp8[0].view(torch.uint8).flatten(), table.to(FP8_DTYPE).view(torch.uint8).flatten()
    ):
        return float("inf")
    worst = 0.0
    window = dict(window=300)
    layouts = [(True, {}, 16), (True, window, 16), (False, {}, 16), (False, window, 16)]
    layouts += [(True, {}, 32), (True, window, 32)]  # pages of 32: an FP8 cache's default
    # pages of 128: each 64-token tile (decode's here, extend's) lies within a page, the
    # windows' first tile mid-page
    layouts += [(True, {}, 128), (True, window, 128), (True, dict(window=7), 128)]
    for by_token, variant, page in layouts:
        decode = with_nan_leftovers(
            with_fp8_cache(
                make_case([1, 17, 600, 1000, 513], [1] * 5, 2, 4, 64, page, torch.float32, "cpu"),
                by_token,
            )
        )
        extend = with_nan_leftovers(
            with_fp8_cache(
                make_case([70, 5, 130, 300], [70, 1, 65, 1], 2, 4, 64, page, torch.float32, "cpu"),
                by_token,
            )
        )
        fp8 = dict(variant, kv_scales=decode["kv_scales"])
        for keys_wide in (True, False):  # the engine's orientation, and the query rows wide
            got = kernels.decode_attention(
                decode["query"], decode["k_cache"], decode["v_cache"], decode["block_tables"],
                decode["seq_lens"], decode["scale"], 1024,
                kernels.DecodeTiles(split_len=256, block_n=64, fp8_keys_wide=keys_wide), **fp8,
            )  # fmt: skip
            worst = max(worst, _error(got, _reference(decode, **fp8)))
        fp8 = dict(variant, kv_scales=extend["kv_scales"])
        got = kernels.extend_attention(
            extend["query"], extend["k_cache"], extend["v_cache"], extend["block_tables"],
            extend["query_start_loc"], extend["seq_lens"], extend["q_block_seq"],
            extend["q_block_start"], extend["scale"], **fp8,
        )  # fmt: skip
        worst = max(worst, _error(got, _reference(extend, **fp8)))
    # The decode kernel's variants and verification steps (3 query tokens a sequence, causal
    # among them) over an FP8 cache, a group of 4 and of 3 (rows padded to the MMA's side).
    for group, query_len in ((4, 1), (3, 1), (4, 3)):
        lens = [5, 17, 600, 1000, 130]
        case = with_fp8_cache(make_case(lens, [query_len] * len(lens), 2, group, 64, 16,
                                        torch.float32, "cpu", seed=group + query_len))  # fmt: skip
        for variant in [{}, *_variants(2 * group)]:
            fp8 = dict(variant, kv_scales=case["kv_scales"])
            got = kernels.decode_attention(
                case["query"], case["k_cache"], case["v_cache"], case["block_tables"],
                case["seq_lens"], case["scale"], 1024,
                kernels.DecodeTiles(split_len=256, block_n=64), query_len=query_len, **fp8,
            )  # fmt: skip
            worst = max(worst, _error(got, _reference(case, **fp8)))
    # The engine's tiles at head_dim 128 (the compile for the GPU sees the launches it makes):
    # groups of 4 and 8, and 4 with the 3 query tokens of a short prompt or a verification;
    # pages of 16 tokens and of 32 (an FP8 cache's default block_size), then 64 and 128 (two
    # pages and one a 128-token tile).
    for group, query_len, page in (
        (4, 1, 16), (8, 1, 16), (4, 3, 16), (4, 1, 32), (4, 3, 32), (4, 1, 64), (4, 1, 128),
    ):  # fmt: skip
        case = with_fp8_cache(make_case([5, 130], [query_len] * 2, 1, group, 128, page,
                                        torch.float32, "cpu", seed=group))  # fmt: skip
        got = kernels.decode_attention(
            case["query"], case["k_cache"], case["v_cache"], case["block_tables"],
            case["seq_lens"], case["scale"], 1024, query_len=query_len,
            kv_scales=case["kv_scales"],
        )  # fmt: skip
        worst = max(worst, _error(got, _reference(case, kv_scales=case["kv_scales"])))
    # A batch that fills the launch alone (a target of 2 programs here) over an FP8 cache: the
    # crowded launches' 32-token tiles in one-warp programs, one piece a sequence or several,
    # and a group of 2 verifying 2 tokens a sequence (4 rows: still keys-wide); then one-warp
    # launches that aim at 32 programs over the 8 pairs (4 pieces a pair wanted); pages of 16
    # tokens (two a tile), of 32 (one a tile), of 64 and 128 (a tile within a page).
    for longest, group, query_len, target, page in (
        (2048, 4, 1, 0, 16), (256, 4, 1, 0, 16), (256, 2, 2, 0, 16), (2048, 4, 1, 32, 16),
        (2048, 4, 1, 0, 32), (256, 2, 2, 0, 32), (2048, 4, 1, 32, 32),
        (2048, 4, 1, 0, 64), (256, 2, 2, 0, 128), (2048, 4, 1, 32, 128),
    ):  # fmt: skip
        case = with_fp8_cache(make_case([5, 130, 600, 1000], [query_len] * 4, 2, group, 128,
                                        page, torch.float32, "cpu", seed=11))  # fmt: skip
        tiles = kernels.DecodeTiles(
            target_programs=2, fp8_full_batch_split_len=longest,
            fp8_one_warp_target_programs=target,
        )  # fmt: skip
        assert tiles.one_warp_tiles(4 * 2, True, True, page)
        got = kernels.decode_attention(
            case["query"], case["k_cache"], case["v_cache"], case["block_tables"],
            case["seq_lens"], case["scale"], 1024, tiles, query_len=query_len,
            kv_scales=case["kv_scales"],
        )  # fmt: skip
        worst = max(worst, _error(got, _reference(case, kv_scales=case["kv_scales"])))
    return worst


def check_decode_linear() -> float:
    g = torch.Generator().manual_seed(0)
    worst = 0.0
    # Ragged rows, columns and K (masked tails), with and without bias; then K a tile multiple.
    for rows, n, k, use_bias in [(5, 100, 300, True), (16, 64, 256, False), (33, 40, 512, True)]:
        x = torch.randn(rows, k, generator=g)
        weight = torch.randn(n, k, generator=g)
        bias = torch.randn(n, generator=g) if use_bias else None
        y = torch.empty(rows, n)
        triton_linear.launch(x, weight, bias, y, 32, 128, 2)
        worst = max(worst, (y - torch.nn.functional.linear(x, weight, bias)).abs().max().item())
    # K split over 4 programs per column block (the counters re-armed: twice in a row)
    x, weight = torch.randn(7, 512, generator=g), torch.randn(80, 512, generator=g)
    for _ in range(2):
        y = torch.empty(7, 80)
        triton_linear.launch(x, weight, None, y, 32, 128, 2, split_k=4)
        worst = max(worst, (y - torch.nn.functional.linear(x, weight)).abs().max().item())
        _check_residual_add(x, weight, None, y, (32, 128, 2, 4))
    return worst


def check_fp8_linear() -> float:
    """The FP8-weight GEMM against its twin: ragged rows, columns and K (masked tails), with and
    without bias, a zero row (scale 1); then K a tile multiple."""
    from rollout.kernels import torch_fp8, triton_linear

    g = torch.Generator().manual_seed(0)
    worst = 0.0
    for rows, n, k, use_bias in [(5, 100, 300, True), (16, 64, 1024, False), (33, 40, 700, True)]:
        x = torch.randn(rows, k, generator=g)
        weight = torch.randn(n, k, generator=g)
        weight[3] = 0.0
        q, scale = torch_fp8.quantize_rows(weight)
        bias = torch.randn(n, generator=g) if use_bias else None
        y = torch.empty(rows, n)
        for split_k in (1, 2):  # 2: only where K is two whole tiles (1,024), else not split
            triton_linear.launch(x, q, bias, y, 32, 256, 2, scale=scale, split_k=split_k)
            want = torch_fp8.fp8_linear_reference(x, q, scale, bias)
            worst = max(worst, _error(y, want))
            _check_residual_add(x, q, bias, y, (32, 256, 2, split_k), scale=scale)
    return worst


def _check_residual_add(x, weight, bias, y, tiles, **kwargs) -> None:
    """The same launch with a residual (a layer's add in the GEMM's last step) gives the
    residual plus its output, bit for bit: the add the kernel saves a launch for."""
    residual = torch.randn(y.shape, generator=torch.Generator().manual_seed(y.numel()))
    summed = torch.empty_like(y)
    triton_linear.launch(x, weight, bias, summed, *tiles, residual=residual, **kwargs)
    assert torch.equal(summed, residual + y), f"residual add differs at {tuple(y.shape)}"


def check_fused_experts() -> float:
    """Experts picked by many, one and no tokens (an expert with more pairs than BLOCK_M loops),
    ragged hidden and intermediate sizes (masked tails), with bf16-style and FP8 weights."""
    from rollout.kernels import torch_fp8

    g = torch.Generator().manual_seed(0)
    worst = 0.0
    cases = [(5, 8, 2, 40, 24, 0.0), (40, 8, 2, 64, 80, 6.0), (40, 4, 2, 64, 80, 0.0)]
    for tokens, experts, top_k, hidden, inter, skew in cases:
        x = torch.randn(tokens, hidden, generator=g)
        logits = torch.randn(tokens, experts, generator=g)
        logits[:, 0] += skew  # every token picks expert 0: 40 pairs, over BLOCK_M (16)
        weights, index = torch.softmax(logits, -1).topk(top_k, dim=-1)
        gate_up = torch.randn(experts, 2 * inter, hidden, generator=g) / hidden**0.5
        down = torch.randn(experts, hidden, inter, generator=g) / inter**0.5
        got = triton_moe.fused_experts(x, index, weights, gate_up, down)
        want = torch_moe.fused_experts_reference(x, index, weights, gate_up, down)
        worst = max(worst, _error(got, want))
        # FP8 experts: e4m3 weights with a scale per output row, against the rounded weights
        (gate_up_q, gate_up_s), (down_q, down_s) = map(torch_fp8.quantize_rows, (gate_up, down))
        got = triton_moe.fused_experts(x, index, weights, gate_up_q, down_q, gate_up_s, down_s)
        rounded = [
            torch_fp8.dequantize_rows(q, s, x.dtype)
            for q, s in ((gate_up_q, gate_up_s), (down_q, down_s))
        ]
        want = torch_moe.fused_experts_reference(x, index, weights, *rounded)
        worst = max(worst, _error(got, want))
    # The prefill and the tail tiles (their bf16 / one-wave choices forced here in fp32): ragged
    # sizes, an expert with more pairs than one block of rows (240) and one with fewer (60).
    tokens, experts, top_k, hidden, inter = 300, 2, 1, 136, 72
    x = torch.randn(tokens, hidden, generator=g)
    index = (torch.arange(tokens) % 5 == 0).long()[:, None]
    weights = torch.rand(tokens, top_k, generator=g)
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=g) / hidden**0.5
    down = torch.randn(experts, hidden, inter, generator=g) / inter**0.5
    want = torch_moe.fused_experts_reference(x, index, weights, gate_up, down)
    default_tiles = triton_moe.tiles
    for forced in (triton_moe.PREFILL_TILES, triton_moe.TAIL_TILES):
        triton_moe.tiles = lambda *args, forced=forced: dict(forced)
        try:
            got = triton_moe.fused_experts(x, index, weights, gate_up, down)
        finally:
            triton_moe.tiles = default_tiles
        worst = max(worst, _error(got, want))
    return worst


def check_counting_sort() -> float:
    """The pairs' expert order, counts and starts equal the twin's stable sort exactly: one pair,
    one chunk and more than one (4,200 pairs), experts not a power of two, every pair on one
    expert, unpicked experts."""
    g = torch.Generator().manual_seed(0)
    mismatches = 0
    cases = [(1, 8, 2), (5, 60, 4), (40, 128, 8), (300, 16, 2), (2100, 16, 2), (7, 3, 1)]
    for tokens, experts, top_k in cases:
        index = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
        for routing in (index, torch.zeros_like(index[:, :1])):
            got = triton_expert_sort.sort_pairs_by_expert(routing, experts)
            want = torch_moe.sort_by_expert(routing, experts)
            mismatches += sum(not torch.equal(a, b) for a, b in zip(got, want, strict=True))
    return float(mismatches)


def check_top_k_routing() -> float:
    """The softmax top-k against the routers' code: the experts exactly, the weights within
    rounding; a handful of tokens or more than a program's block, experts not a power of two,
    renormalized or not, cast or fp32. Equal logits go to the lower index, in that order."""
    g = torch.Generator().manual_seed(0)
    worst = 0.0
    cases = [(1, 8, 2), (37, 60, 4), (5, 128, 8), (20, 3, 1)]
    for tokens, experts, top_k in cases:
        logits = torch.randn(tokens, experts, generator=g)
        for renormalize, dtype in [
            (True, torch.float32),
            (False, torch.float32),
            (True, torch.bfloat16),
        ]:
            got = triton_routing.top_k_routing(logits, top_k, renormalize, dtype)
            want = torch_moe.top_k_routing_reference(logits, top_k, renormalize, dtype)
            if not torch.equal(got[1], want[1]) or got[0].dtype != dtype:
                return float("inf")
            worst = max(
                worst, _error(got[0].float(), want[0].float()) if dtype == torch.float32 else 0.0
            )
    ties = torch.zeros(2, 6)
    ties[1, 4] = 1.0
    _, index = triton_routing.top_k_routing(ties, 3, True, torch.float32)
    if index.tolist() != [[0, 1, 2], [4, 0, 1]]:
        return float("inf")
    return worst


def check_sampler() -> float:
    """The one-pass sampler against the torch sampler it twins: greedy and sampled rows, a
    vocabulary split into two slices with a short last block, rows drawing from a shared logits
    row. Tokens must agree on every row; returns the largest logprob difference."""
    import numpy as np

    from rollout.engine.execution.sampler import Sampler, SamplingTensors
    from rollout.engine.scheduling.sample_keys import row_keys
    from rollout.kernels import triton_sampler

    rows, vocab = 6, 9000
    assert triton_sampler.num_slices(rows, vocab) == 2
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(5)) * 3
    row_logits = torch.tensor([0, 1, 2, 3, 3, 3])
    temperature = torch.tensor([0.0, 0.7, 1.0, 0.0, 1.3, 1.0])
    keys = torch.from_numpy(
        row_keys(np.arange(rows, dtype=np.uint64), np.zeros(rows, np.uint64),
                 np.arange(rows, dtype=np.uint64))
    )  # fmt: skip
    params = SamplingTensors(
        temperature=temperature, top_k=torch.zeros(rows, dtype=torch.int64),
        top_p=torch.ones(rows), min_p=torch.zeros(rows), keys=keys, needs_sort=False,
        needs_min_p=False,
    )  # fmt: skip
    want_tokens, want_logprobs = Sampler(vocab, torch.device("cpu"))(logits[row_logits], params)
    tokens = torch.empty(rows, dtype=torch.int64)
    logprobs = torch.empty(rows, dtype=torch.float32)
    triton_sampler.sample_plain(logits, row_logits, temperature, keys, tokens, logprobs)
    if not torch.equal(tokens, want_tokens):
        return float("inf")
    return (logprobs - want_logprobs).abs().max().item()


def check_w8a8_linear() -> float:
    """The FP8-activation GEMM (activation_quantization="fp8" and "fp8-group": the FP8 MMA)
    against its twin, the fp32 GEMM of the dequantized operands: x rounded to e4m3 with a scale
    a row, or a row and 128 of K, whole and split over K, one row block or several, ragged rows,
    columns and K, with and without bias."""
    from rollout.kernels import torch_fp8, triton_linear

    g = torch.Generator().manual_seed(3)
    worst = 0.0
    for rows, n, k, use_bias in [(5, 100, 300, True), (20, 48, 512, False), (33, 40, 700, True)]:
        x = torch.randn(rows, k, generator=g)
        x[1] *= 1e-4
        x[2, 128:256] *= 8  # one group of a row above the rest: another scale
        q, scale = torch_fp8.quantize_rows(torch.randn(n, k, generator=g) * 0.02)
        bias = torch.randn(n, generator=g) if use_bias else None
        for grouped in (False, True):
            quantize = torch_fp8.quantize_groups if grouped else torch_fp8.quantize_rows
            dequantize = torch_fp8.dequantize_groups if grouped else torch_fp8.dequantize_rows
            x8, x_scale = quantize(x)
            want = torch_fp8.fp8_linear_reference(
                dequantize(x8, x_scale, torch.float32), q, scale, bias
            )
            y = torch.empty(rows, n)
            # 2: K split where K is two whole tiles (512), else not; 16-column blocks over
            # 256-wide K tiles as the few rows' tiles (a scale a row only: groups are 128 wide)
            tile_choices = [(32, 128, 2, 1), (32, 128, 2, 2)] + (
                [] if grouped else [(16, 256, 2, 1)]
            )
            for block_m in (16, None):  # row blocks of 16, or one for all rows
                for tiles in tile_choices:
                    triton_linear.launch(
                        x8, q, bias, y, *tiles, scale=scale, x_scale=x_scale, block_m=block_m
                    )
                    worst = max(worst, _error(y, want))
                    _check_residual_add(
                        x8, q, bias, y, tiles, scale=scale, x_scale=x_scale, block_m=block_m
                    )
    return worst


def check_rounded_rows() -> float:
    """The kernels that round their outputs for FP8 activations against their twins: the
    RMSNorm with and without the residual add, silu(gate) * up, and the rounding alone (o's
    input); a scale a row or per 128 inputs, rows of other magnitudes and a group far above its
    row's others, widths that are not a power of two; the rounded rows, their e4m3 bytes and
    scales, and the sum."""
    from rollout.kernels import torch_rounded_rows, triton_rounded_rows

    g = torch.Generator().manual_seed(4)
    worst = 0.0
    for n, residual, grouped in [(300, True, True), (300, False, False), (512, False, True),
                                 (64, True, True), (1000, True, False)]:  # fmt: skip
        x = torch.randn(6, n, generator=g)
        x[1] *= 1e-3
        x[2, 128 : min(n, 256)] *= 300
        r = torch.randn(6, n, generator=g) if residual else None
        weight = torch.randn(n, generator=g)
        got = triton_rounded_rows.launch_norm(x, weight, 1e-6, grouped, r)
        want = torch_rounded_rows.rms_norm_rounded(x, weight, 1e-6, grouped, r)
        if residual:
            worst = max(worst, _error(got[0], want[0]))
        worst = max(worst, _error(got[1], want[1]), _error(got[3], want[3]))
        if not torch.equal(got[2].float(), want[2].float()):
            return float("inf")
        bare = triton_rounded_rows.launch_norm(x, weight, 1e-6, grouped, r, with_rows=False)
        if not _same_fp8_form(bare[1:], got[1:]) or (residual and not torch.equal(bare[0], got[0])):
            return float("inf")
        got = triton_rounded_rows.launch_round(x, grouped)  # the rounding alone (o's input)
        want = torch_rounded_rows.rounded(x, grouped)
        worst = max(worst, _error(got[0], want[0]), _error(got[2], want[2]))
        if not torch.equal(got[1].float(), want[1].float()):
            return float("inf")
        if not _same_fp8_form(triton_rounded_rows.launch_round(x, grouped, with_rows=False), got):
            return float("inf")
        gate_up = torch.randn(6, 2 * n, generator=g) * 3
        gate_up[2, n + 128 : n + min(n, 256)] *= 300
        got = triton_rounded_rows.launch_silu_mul(gate_up, grouped)
        want = torch_rounded_rows.silu_mul_rounded(gate_up, grouped)
        worst = max(worst, _error(got[0], want[0]), _error(got[2], want[2]))
        if not torch.equal(got[1].float(), want[1].float()):
            return float("inf")
        bare = triton_rounded_rows.launch_silu_mul(gate_up, grouped, with_rows=False)
        if not _same_fp8_form(bare, got):
            return float("inf")
    return worst


def check_gate_up_silu() -> float:
    """The W8A8 gate/up GEMM with silu(gate) * up in its last step, then the rounding spread
    over (row, chunk) programs: the product against the unfused W8A8 GEMM (the same tiles'
    bytes) and against the fp32 twin, to the GEMM's precision; the FP8 form exactly the twin's
    rounding of the product stored. One row, a row block, two row blocks (33 rows), columns
    and K that are not whole tiles, a row far below the others, a column block far above."""
    import torch.nn.functional as F

    from rollout.kernels import torch_fp8, triton_gate_up_silu

    g = torch.Generator().manual_seed(5)
    worst = 0.0
    for rows, inter, k in [(1, 64, 256), (5, 100, 384), (33, 40, 300)]:
        x = torch.randn(rows, k, generator=g)
        x[-1] *= 1e-4
        weight = torch.randn(2 * inter, k, generator=g) * 0.05
        weight[: min(inter, 32)] *= 20  # the first column block's gate far above the rest
        x8, x_scale = torch_fp8.quantize_rows(x)
        q, scale = torch_fp8.quantize_rows(weight)
        y, y8, y_scale = triton_gate_up_silu.launch(x8, x_scale, q, scale, torch.float32, hw=False)
        block_m, block_n, block_k, stages, warps = triton_gate_up_silu.tiles(rows)
        gate_up = torch.empty(rows, 2 * inter)
        triton_linear.launch(
            x8, q, None, gate_up, 2 * block_n, block_k, stages, 1, warps,
            scale=scale, x_scale=x_scale, block_m=block_m,
        )  # fmt: skip
        gate, up = gate_up.chunk(2, dim=-1)
        worst = max(worst, _error(y, F.silu(gate) * up))
        twin = torch_fp8.fp8_linear_reference(
            torch_fp8.dequantize_rows(x8, x_scale, torch.float32), q, scale, None
        )
        gate, up = twin.chunk(2, dim=-1)
        worst = max(worst, _error(y, F.silu(gate) * up))
        want_q, want_scale = torch_fp8.quantize_rows(y)
        if not (torch.equal(y8.view(torch.uint8), want_q.view(torch.uint8))
                and torch.equal(y_scale, want_scale)):  # fmt: skip
            return float("inf")
    return worst


def _same_fp8_form(bare, full) -> bool:
    """A rounding launch without the rows in the activations' dtype: y [rows, 0], and the same
    e4m3 bytes and scales as the launch with them."""
    (y, q, scale), (full_y, full_q, full_scale) = bare, full
    return (
        y.shape == (*full_y.shape[:-1], 0)
        and torch.equal(q.view(torch.uint8), full_q.view(torch.uint8))
        and torch.equal(scale, full_scale)
    )


def check_qk_rope() -> float:
    """Qwen3's q/k norms and rotary in one launch against their twin: decode's token a program
    and prefill's eight (a partial last tile), head_dims whose halves are and are not a power of
    two, rows of other magnitudes, the value heads left out."""
    from rollout.kernels import torch_qk_rope, triton_qk_rope

    g = torch.Generator().manual_seed(6)
    worst = 0.0
    for tokens, head_dim, num_q, num_kv in [(1, 128, 4, 2), (5, 96, 2, 1), (300, 16, 4, 2)]:
        qkv = torch.randn(tokens, (num_q + 2 * num_kv) * head_dim, generator=g)
        qkv[tokens // 2] *= 1e3
        q_weight, k_weight = torch.randn(2, head_dim, generator=g)
        angles = torch.rand(tokens, head_dim, generator=g) * 30
        cos, sin = angles.cos(), angles.sin()
        got = triton_qk_rope.launch(qkv, q_weight, k_weight, 1e-6, cos, sin, num_q, num_kv)
        want = torch_qk_rope.qk_norm_rope(qkv, q_weight, k_weight, 1e-6, cos, sin, num_q, num_kv)
        worst = max(worst, _error(got, want))
        for fp8 in (False, True):
            args = (qkv, q_weight, k_weight, 1e-6, cos, sin, num_q, num_kv)
            if not _qk_rope_writes_what_write_kv_would(got, *args, fp8=fp8, g=g):
                return float("inf")
    return worst


def _qk_rope_writes_what_write_kv_would(normed, qkv, *args, fp8: bool, g) -> bool:
    """The q/k launch that also writes the cache: its output the plain launch's, and the cache
    (the engine's layouts: an FP8 cache's K head by head, V by token, scales head by head) the
    twin `write_kv`'s bytes and scales from that output's keys and qkv's values, a padded
    token's slot (-1) left alone."""
    from rollout.kernels import triton_qk_rope
    from rollout.kernels.torch_fp8 import FP8_DTYPE

    tokens, (num_q, num_kv), head_dim = qkv.shape[0], args[-2:], args[0].shape[0]
    blocks, page = -(-tokens // 16) + 1, 32 if fp8 else 16
    slots = torch.randperm(blocks * page, generator=g)[:tokens].to(torch.int32)
    if tokens > 1:  # one token left: it is written
        slots[tokens // 3] = -1
    dtype = FP8_DTYPE if fp8 else torch.float32
    caches = [torch.zeros(blocks, page, num_kv, head_dim, dtype=dtype) for _ in range(4)]
    scales = [torch.ones(blocks, page, num_kv) for _ in range(4)] if fp8 else [None] * 4
    if fp8:
        caches[0], caches[1] = twin.keys_by_head(caches[0]), twin.v_by_token(caches[1])
        scales[0], scales[1] = twin.scales_by_head(scales[0]), twin.scales_by_head(scales[1])
    kv = triton_qk_rope.KVWrite(caches[0], caches[1], slots, scales[0], scales[1])
    got = triton_qk_rope.launch(qkv, *args, kv)
    key = normed[:, num_q:]
    value = qkv[:, (num_q + num_kv) * head_dim :].reshape(tokens, num_kv, head_dim)
    twin.write_kv(key, value, caches[2], caches[3], slots, scales[2], scales[3])
    same = torch.equal(got, normed)
    for a, b in ((0, 2), (1, 3)):
        same &= torch.equal(caches[a].view(torch.uint8), caches[b].view(torch.uint8))
        if fp8:
            same &= torch.equal(scales[a], scales[b])
    return same


if __name__ == "__main__":
    failed = False
    for name, check in [
        ("decode", check_decode),
        ("extend", check_extend),
        ("window/softcap/sinks", check_variants),
        ("verification rows in the decode kernel", check_verification),
        ("write_kv", check_write_kv),
        ("FP8 KV cache: write, decode, extend", check_fp8_kv),
        ("decode_linear", check_decode_linear),
        ("fp8_linear", check_fp8_linear),
        ("fused_experts", check_fused_experts),
        ("counting sort of the experts' pairs", check_counting_sort),
        ("softmax top-k routing", check_top_k_routing),
        ("one-pass sampler", check_sampler),
        ("FP8 activations and weights GEMM", check_w8a8_linear),
        ("RMSNorm and silu * up rounded for FP8 activations", check_rounded_rows),
        ("gate/up with silu * up in its last step, rounded", check_gate_up_silu),
        ("Qwen3's q/k norms and rotary", check_qk_rope),
    ]:
        error = check()
        print(f"{name}: max |triton - twin| = {error:.3g}")
        failed |= not error < 1e-4
    sys.exit(1 if failed else 0)
