"""The W8A8 GEMM's tile choices (`triton_w8a8_linear._fp8_mma_tiles`) for Qwen3-8B's shapes at
the tail's and the crowded middle's few rows."""

from __future__ import annotations

import pytest

from rollout.kernels import triton_w8a8_linear

QKV, O_PROJ, GATE_UP, DOWN = (6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)


@pytest.mark.parametrize("rows", [1, 8, 16, 32])
def test_few_rows_take_unsplit_narrow_blocks_and_split_only_a_long_k(rows) -> None:
    block_m = max(16, rows)
    tiles = triton_w8a8_linear._fp8_mma_tiles
    assert tiles(rows, *QKV) == ((16, 256, 4, 1, 2), block_m)
    assert tiles(rows, *O_PROJ) == ((16, 256, 4, 1, 2), block_m)
    assert tiles(rows, *DOWN) == ((32, 256, 4, 2, 4), block_m)
    assert tiles(rows, *GATE_UP) == ((64, 128, 4, 1, 4), block_m)


@pytest.mark.parametrize("rows", [1, 8, 32, 64])
def test_scales_per_128_inputs_keep_k_tiles_of_128(rows) -> None:
    for shape in (QKV, O_PROJ, GATE_UP, DOWN):
        (_, block_k, *_), _ = triton_w8a8_linear._fp8_mma_tiles(rows, *shape, grouped=True)
        assert block_k == 128
