"""The W8A8 GEMM's tile choices (`triton_w8a8_linear._fp8_mma_tiles`) for Qwen3-8B's shapes: the
few rows' tiles, and the deep one-program-an-SM tiles only where a launch fits one wave and the
device has the shared memory for them."""

from __future__ import annotations

import pytest
import torch

from rollout.kernels import triton_w8a8_linear
from rollout.kernels.tiling import W8A8_MAX_ROWS

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


def test_only_a_wide_bf16_output_with_row_scales_and_no_residual_goes_to_the_library(
    monkeypatch,
) -> None:
    """`library_gemm_pays`: gate/up from LIBRARY_MIN_ROWS rows on a Hopper GPU; never a narrow
    output, scales per 128 inputs, a residual to add, fp16 out, block scales or an older GPU."""
    capability = [(9, 0)]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d: capability[0])
    n, k = GATE_UP
    row_scales = torch.ones(n)
    cuda = torch.device("cuda")

    def pays(rows=128, n=n, k=k, grouped=False, residual=None, dtype=torch.bfloat16, bias=None,
             scale=row_scales) -> bool:  # fmt: skip
        return triton_w8a8_linear.library_gemm_pays(
            rows, n, k, grouped, residual, dtype, bias, scale, cuda
        )

    first = triton_w8a8_linear.LIBRARY_MIN_ROWS
    assert pays() and pays(rows=first) and not pays(rows=first - 1)
    assert not pays(rows=W8A8_MAX_ROWS + 1)  # prefill's rows: F.linear's
    assert pays(bias=torch.ones(n, dtype=torch.bfloat16))
    assert not pays(bias=torch.ones(n, dtype=torch.float16))
    assert not pays(n=DOWN[0], k=DOWN[1], scale=torch.ones(DOWN[0]))  # narrow
    assert not pays(grouped=True)
    assert not pays(residual=torch.zeros(128, n, dtype=torch.bfloat16))
    assert not pays(dtype=torch.float16)
    assert not pays(scale=torch.ones(n, 32))  # not a scale a row
    assert not pays(k=4104)  # K not a multiple of 16
    capability[0] = (8, 9)
    assert not pays()
    monkeypatch.setattr(triton_w8a8_linear, "LIBRARY_MIN_ROWS", 0)
    capability[0] = (9, 0)
    assert not pays()  # the route off
