"""How an FP8 cache is read: which tiles its keys widen to (`triton_attention_tiles.fp16_keys`)
and how long the decode kernel's pieces get at a full batch."""

from __future__ import annotations

import pytest
import torch

from rollout.kernels import triton_attention_tiles
from rollout.kernels.tiling import DecodeTiles
from rollout.kernels.triton_decode_attention import DECODE_TILES


@pytest.mark.parametrize("choice, fp16_keys", [("fp16 K", True), ("bf16", False)])
def test_only_bf16_queries_over_an_fp8_cache_take_fp16_keys(monkeypatch, choice, fp16_keys):
    monkeypatch.setattr(triton_attention_tiles, "FP8_KV_TILES", choice)
    bf16, fp32 = torch.zeros(1, dtype=torch.bfloat16), torch.zeros(1)
    assert triton_attention_tiles.fp16_keys(bf16, True) is fp16_keys
    assert triton_attention_tiles.fp16_keys(bf16, False) is False  # no FP8 cache
    assert triton_attention_tiles.fp16_keys(fp32, True) is False  # fp32 stays exact


def test_fp16_keys_is_the_default() -> None:
    assert triton_attention_tiles.FP8_KV_TILES == "fp16 K"


@pytest.mark.parametrize("choice", ["fp8", "fp16"])
def test_an_unknown_choice_is_refused(monkeypatch, choice) -> None:
    monkeypatch.setattr(triton_attention_tiles, "FP8_KV_TILES", choice)
    with pytest.raises(ValueError, match="'fp16 K' or 'bf16'"):
        triton_attention_tiles.fp16_keys(torch.zeros(1, dtype=torch.bfloat16), True)


def test_merge_loads_hold_a_power_of_two_of_pairs() -> None:
    from rollout.kernels.triton_decode_attention import DecodeTiles

    assert DECODE_TILES.merge_pairs == 32
    for pairs in (0, 48):
        with pytest.raises(ValueError, match="merge_pairs must be a power of two"):
            DecodeTiles(merge_pairs=pairs)
    for pairs in (-1, 24):
        with pytest.raises(ValueError, match="fp8_one_warp_merge_pairs must be 0 or a power"):
            DecodeTiles(fp8_one_warp_merge_pairs=pairs)
    # the one-warp launches' own merge loads: 0 keeps merge_pairs
    assert DECODE_TILES.merge_load_pairs(True) == DECODE_TILES.merge_load_pairs(False) == 32
    fewer = DecodeTiles(fp8_one_warp_merge_pairs=16)
    assert (fewer.merge_load_pairs(True), fewer.merge_load_pairs(False)) == (16, 32)


def test_an_fp8_cache_puts_the_keys_on_the_mmas_wide_side_by_default() -> None:
    assert DECODE_TILES.fp8_keys_wide is True


def test_an_fp8_cache_takes_longer_pieces_only_at_a_full_batch() -> None:
    full = DECODE_TILES.splits_per_sequence(128, 8)
    assert full == 1
    assert DECODE_TILES.longest_piece(full) == 1024
    assert DECODE_TILES.longest_piece(full, fp8_kv=True) == 2048
    middle = DECODE_TILES.splits_per_sequence(6, 8)
    assert middle > 1
    assert DECODE_TILES.longest_piece(middle, fp8_kv=True) == DECODE_TILES.split_len


def test_an_fp8_cache_takes_longer_pieces_at_a_few_sequences() -> None:
    """At up to 4 sequences of 8 KV heads a launch over an FP8 cache wants 8 or more pieces a
    sequence; 512-token pieces would make 2-3 times that many, so they may grow to 2,048."""
    for seqs in (1, 2, 3, 4):
        wanted = DECODE_TILES.splits_per_sequence(seqs, 8)
        assert wanted >= 8
        assert DECODE_TILES.longest_piece(wanted, fp8_kv=True) == 2048
        assert DECODE_TILES.longest_piece(wanted) == DECODE_TILES.split_len  # bf16: unchanged
    assert DECODE_TILES.pieces(3, 8, 16999, fp8_kv=True) == (11, 2048, 11)  # was 34 deep
    off = DecodeTiles(fp8_few_sequences_min_splits=0)
    assert off.longest_piece(off.splits_per_sequence(3, 8), fp8_kv=True) == off.split_len


def test_the_grid_is_as_deep_as_the_longest_context_cut_into_pieces() -> None:
    """A few sequences aim at many pieces each; the grid's depth covers the static maximum
    context cut into the longest pieces, and never holds pieces shorter than a tile."""
    tiles = DECODE_TILES
    wanted, longest, depth = tiles.pieces(2, 8, 16384)
    assert (wanted, longest, depth) == (16, 512, 32)  # 256 programs over 2 x 8; 16384 / 512
    assert tiles.pieces(2, 8, 1000) == (16, 512, 8)  # no piece shorter than a 128-token tile
    assert tiles.pieces(128, 8, 16384, fp8_kv=True) == (1, 2048, 8)  # a full batch: long pieces
    assert tiles.pieces(1, 8, 100) == (32, 512, 1)


def test_the_engine_lays_an_fp8_caches_v_out_by_token_and_the_kernels_see_it() -> None:
    """allocate_kv_caches holds an FP8 cache's V by token (a bf16 cache's by dim), which the
    kernels tell from the strides; a layout they cannot read so is refused before a launch."""
    from rollout.engine.execution.kv_cache import KVCacheShape, allocate_kv_caches
    from rollout.kernels.torch_fp8 import FP8_DTYPE
    from rollout.kernels.torch_paged_attention import v_by_token
    from rollout.kernels.triton_decode_attention import DecodeTiles, decode_attention

    shape = KVCacheShape(num_layers=2, num_kv_heads=2, head_dim=8)
    fp8 = allocate_kv_caches(shape, 5, 16, FP8_DTYPE, torch.device("cpu"))[1]
    bf16 = allocate_kv_caches(shape, 5, 16, torch.bfloat16, torch.device("cpu"))[1]
    assert fp8.v.shape == fp8.k.shape == bf16.v.shape == (5, 16, 2, 8)
    assert triton_attention_tiles.reads_v_by_token(fp8.k, fp8.v, fp8_kv=True)
    assert not triton_attention_tiles.reads_v_by_token(bf16.k, bf16.v, fp8_kv=False)
    assert not triton_attention_tiles.reads_v_by_token(fp8.k, fp8.k, fp8_kv=True)  # K: by dim
    with pytest.raises(ValueError, match="needs an FP8 cache"):
        triton_attention_tiles.reads_v_by_token(bf16.k, v_by_token(bf16.v), fp8_kv=False)
    page_128 = allocate_kv_caches(shape, 5, 128, FP8_DTYPE, torch.device("cpu"))[0]
    assert triton_attention_tiles.reads_v_by_token(page_128.k, page_128.v, fp8_kv=True)
    wide = allocate_kv_caches(shape, 5, 256, FP8_DTYPE, torch.device("cpu"))[0]
    assert not triton_attention_tiles.reads_v_by_token(wide.k, wide.v, fp8_kv=True)  # 256: by dim
    odd = allocate_kv_caches(shape, 5, 24, FP8_DTYPE, torch.device("cpu"))[0]
    assert not triton_attention_tiles.reads_v_by_token(odd.k, odd.v, fp8_kv=True)  # 24: by dim
    query = torch.zeros(1, 4, 8, dtype=torch.bfloat16)
    tables, lens = torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="hold whole pages or lie within one"):
        decode_attention(
            query, fp8.k, fp8.v, tables, lens, 1.0, 16, DecodeTiles(block_n=24),
            kv_scales=(fp8.k_scale, fp8.v_scale),
        )  # fmt: skip


def test_the_engine_lays_an_fp8_caches_scales_out_head_by_head() -> None:
    """allocate_kv_caches holds each layer's FP8 scales [num_blocks, block_size, num_kv_heads]
    head by head in memory (a page's scales of one KV head side by side, as `scales_by_head`
    lays them out), and the torch write stores through that view the scales it stores in a
    plain one; the kernels take the scales' strides, and refuse K and V scales laid out unlike
    each other."""
    from rollout.engine.execution.kv_cache import KVCacheShape, allocate_kv_caches
    from rollout.kernels import torch_paged_attention as twin
    from rollout.kernels.torch_fp8 import FP8_DTYPE

    shape = KVCacheShape(num_layers=2, num_kv_heads=3, head_dim=8)
    layer = allocate_kv_caches(shape, 5, 16, FP8_DTYPE, torch.device("cpu"))[1]
    assert layer.k_scale.shape == layer.v_scale.shape == (5, 16, 3)
    assert layer.k_scale.stride() == layer.v_scale.stride() == (48, 1, 16)
    assert layer.k.shape == (5, 16, 3, 8) and layer.k.stride() == (384, 8, 128, 1)  # K by head
    by_slot = torch.arange(5 * 16 * 3, dtype=torch.float32).view(5, 16, 3)
    by_head = twin.scales_by_head(by_slot)
    assert torch.equal(by_head, by_slot) and by_head.stride() == (48, 1, 16)
    assert triton_attention_tiles.kv_scale_args(layer.k, (layer.k_scale, layer.v_scale))[2:] == (
        48, 1, 16,
    )  # fmt: skip
    with pytest.raises(ValueError, match="share a layout"):
        triton_attention_tiles.kv_scale_args(layer.k, (layer.k_scale, by_slot))
    key = torch.randn(4, 3, 8) * torch.tensor([1.0, 1e3, 1e-3])[None, :, None]
    slots = torch.tensor([0, 17, 33, 79])
    twin.write_kv(key, key, layer.k, layer.v, slots, layer.k_scale, layer.v_scale)
    plain = [torch.zeros(5, 16, 3, 8, dtype=FP8_DTYPE) for _ in range(2)]
    plain_scales = [torch.ones(5, 16, 3) for _ in range(2)]
    twin.write_kv(key, key, *plain, slots, *plain_scales)
    assert torch.equal(layer.k_scale, plain_scales[0]) and torch.equal(
        layer.v_scale, plain_scales[1]
    )


def test_only_a_full_fp8_batch_read_keys_wide_takes_one_warp_programs() -> None:
    """DecodeTiles.one_warp_tiles and tile_shape: 32-token tiles in one-warp programs once one
    piece a (sequence, KV head) fills the launch over an FP8 cache with the keys-wide tiles;
    128-token tiles in four warps for a bf16 cache, a launch that wants more pieces, rows-wide
    tiles; pages wider than the small tile take it too (a tile within one page)."""
    tiles = DECODE_TILES
    full = 32 * 8
    assert tiles.splits_per_sequence(32, 8) == 1
    assert tiles.one_warp_tiles(full, True, True, 16)
    assert tiles.tile_shape(True) == (32, 1)
    default = (tiles.block_n, tiles.num_warps)
    assert tiles.tile_shape(False) == default == (128, 4)
    assert not tiles.one_warp_tiles(full, False, True, 16)  # bf16 cache
    assert not tiles.one_warp_tiles(31 * 8, True, True, 16)  # several pieces a pair wanted
    assert not tiles.one_warp_tiles(full, True, False, 16)  # rows-wide tiles
    assert tiles.one_warp_tiles(full, True, True, 64)  # pages of 64 tokens: two tiles a page
    assert not DecodeTiles(fp8_full_batch_block_n=48).one_warp_tiles(full, True, True, 32)
    assert not tiles.one_warp_tiles(full, True, True, 256)  # V by dim at 256: never timed
    for off in (DecodeTiles(fp8_full_batch_block_n=0), DecodeTiles(fp8_full_batch_num_warps=0)):
        assert not off.one_warp_tiles(full, True, True, 16)
    assert not DecodeTiles(target_programs=0).one_warp_tiles(full, True, True, 16)


def test_the_one_warp_knobs_at_zero_launch_as_the_full_batch_rule() -> None:
    """fp8_one_warp_min_pairs and fp8_one_warp_target_programs at 0 (the defaults): every launch
    over 1-160 sequences of 1-8 KV heads takes the tiles, pieces and grid of the rule they
    generalize (one-warp tiles exactly where one piece a pair is wanted)."""
    tiles = DECODE_TILES
    assert tiles.fp8_one_warp_min_pairs == tiles.fp8_one_warp_target_programs == 0
    for seqs in range(1, 161):
        for heads in (1, 2, 4, 8):
            for visible in (100, 4096, 40000):
                old_wanted = tiles.splits_per_sequence(seqs, heads)
                old = (old_wanted, tiles.longest_piece(old_wanted, True))
                old_depth = max(old_wanted, -(-visible // old[1]))
                old += (max(1, min(old_depth, -(-visible // tiles.block_n))),)
                one_warp = tiles.one_warp_tiles(seqs * heads, True, True, 16)
                assert one_warp == (old_wanted == 1)
                assert tiles.pieces(seqs, heads, visible, True, one_warp) == old


def test_one_warp_launches_may_aim_at_more_programs_from_fewer_pairs() -> None:
    """With fp8_one_warp_min_pairs and fp8_one_warp_target_programs set, one-warp launches start
    at that many pairs and cut each pair's context into pieces (of up to the full batch's
    2,048 tokens) until the launch has the programs it aims at."""
    tiles = DecodeTiles(fp8_one_warp_min_pairs=128, fp8_one_warp_target_programs=1024)
    assert not tiles.one_warp_tiles(15 * 8, True, True, 16)
    assert tiles.one_warp_tiles(16 * 8, True, True, 16)
    assert tiles.pieces(16, 8, 16384, True, True) == (8, 2048, 8)
    assert tiles.pieces(32, 8, 16384, True, True) == (4, 2048, 8)
    assert tiles.pieces(32, 8, 100, True, True) == (4, 2048, 4)  # pieces of one 32-token tile
    assert tiles.pieces(128, 8, 16384, True, True) == (1, 2048, 8)
    assert tiles.pieces(32, 8, 16384, True, False) == (1, 2048, 8)  # four-warp: as before


def test_the_one_warp_launches_may_have_a_register_cap_of_their_own() -> None:
    """DecodeTiles.register_cap: fp8_one_warp_max_registers caps the one-warp launches alone;
    every other launch keeps max_registers (0 at both: the compiler's choice)."""
    assert DECODE_TILES.register_cap(True) == DECODE_TILES.register_cap(False) == 0
    capped = DecodeTiles(fp8_one_warp_max_registers=128)
    assert (capped.register_cap(True), capped.register_cap(False)) == (128, 0)
    both = DecodeTiles(fp8_one_warp_max_registers=128, max_registers=96)
    assert (both.register_cap(True), both.register_cap(False)) == (128, 96)
    assert DecodeTiles(max_registers=96).register_cap(True) == 96


def test_the_one_warp_launches_may_have_pipeline_stages_of_their_own() -> None:
    """DecodeTiles.stages: fp8_one_warp_num_stages for the one-warp launches (two K/V buffers
    at 5), num_stages for every other launch, and for the one-warp ones too at 0 (the default)."""
    assert DECODE_TILES.stages(True) == DECODE_TILES.stages(False) == DECODE_TILES.num_stages
    assert DecodeTiles(num_stages=2).stages(True) == 2
    assert DecodeTiles(fp8_one_warp_num_stages=5).stages(True) == 5
    assert DecodeTiles(fp8_one_warp_num_stages=7).stages(True) == 7
    assert DecodeTiles(fp8_one_warp_num_stages=7).stages(False) == 3
