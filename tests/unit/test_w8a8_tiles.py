"""The W8A8 GEMM's tile choices (`triton_w8a8_linear._fp8_mma_tiles`) for Qwen3-8B's shapes: the
few rows' tiles, and the deep one-program-an-SM tiles only where a launch fits one wave and the
device has the shared memory for them."""

from __future__ import annotations

import pytest
import torch

from rollout.kernels import triton_w8a8_linear

QKV, O_PROJ, GATE_UP, DOWN = (6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)
HOPPER = (132, 227 * 1024)  # SMs, shared memory a program may ask for
ADA = (58, 99 * 1024)


def _tiles(monkeypatch, device: tuple[int, int], rows: int, shape, grouped: bool = False):
    sms, shared = device
    monkeypatch.setattr(triton_w8a8_linear, "sm_count", lambda d: sms)
    monkeypatch.setattr(triton_w8a8_linear, "shared_memory_per_program", lambda d: shared)
    return triton_w8a8_linear._fp8_mma_tiles(rows, *shape, grouped, torch.device("cuda"))


@pytest.mark.parametrize("rows", [1, 8, 16, 32])
def test_few_rows_take_unsplit_narrow_blocks_and_split_only_a_long_k(rows, monkeypatch) -> None:
    block_m = max(16, rows)
    assert _tiles(monkeypatch, HOPPER, rows, QKV) == ((16, 256, 4, 1, 2), block_m)
    assert _tiles(monkeypatch, HOPPER, rows, O_PROJ) == ((16, 256, 4, 1, 2), block_m)
    assert _tiles(monkeypatch, HOPPER, rows, DOWN) == ((32, 256, 4, 2, 4), block_m)
    assert _tiles(monkeypatch, HOPPER, rows, GATE_UP) == ((64, 128, 4, 1, 4), block_m)


@pytest.mark.parametrize("rows", [33, 64, 100, 128])
def test_deep_tiles_where_the_launch_is_one_wave(rows, monkeypatch) -> None:
    deep = (triton_w8a8_linear._DEEP_TILES, 64)
    assert _tiles(monkeypatch, HOPPER, rows, O_PROJ) == deep  # 64 column blocks x 1-2 row blocks
    assert _tiles(monkeypatch, HOPPER, rows, DOWN) == deep
    assert (_tiles(monkeypatch, HOPPER, rows, QKV) == deep) is (rows <= 64)  # 96 x 1, 96 x 2
    assert _tiles(monkeypatch, HOPPER, rows, GATE_UP)[0] != triton_w8a8_linear._DEEP_TILES


@pytest.mark.parametrize("rows", [1, 16, 32])
def test_few_rows_with_group_scales_take_the_same_blocks_over_the_groups_k(
    rows, monkeypatch
) -> None:
    block_m = max(16, rows)
    assert _tiles(monkeypatch, HOPPER, rows, QKV, True) == ((16, 128, 6, 1, 2), block_m)
    assert _tiles(monkeypatch, HOPPER, rows, DOWN, True) == ((32, 128, 6, 2, 4), block_m)
    assert _tiles(monkeypatch, HOPPER, rows, GATE_UP, True) == ((64, 128, 4, 1, 4), block_m)


@pytest.mark.parametrize("rows", [8, 64, 128])
def test_no_deep_tiles_with_group_scales_or_without_the_shared_memory(rows, monkeypatch) -> None:
    for shape in (QKV, O_PROJ, GATE_UP, DOWN):
        tiles, _ = _tiles(monkeypatch, HOPPER, rows, shape, grouped=True)
        assert tiles[1] == 128  # a scale per 128 of K: K tiles of 128
        assert _tiles(monkeypatch, ADA, rows, shape)[0] != triton_w8a8_linear._DEEP_TILES
