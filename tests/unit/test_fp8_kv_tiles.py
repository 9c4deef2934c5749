"""Which tiles an FP8 cache is read through (`triton_attention_tiles.f16_tiles`)."""

from __future__ import annotations

import pytest
import torch

from rollout.kernels import triton_attention_tiles


@pytest.mark.parametrize(
    "choice, tiles",
    [("bf16", (False, False)), ("fp16", (True, True)), ("fp16 K", (True, False))],
)
def test_only_bf16_queries_over_an_fp8_cache_take_fp16_tiles(monkeypatch, choice, tiles) -> None:
    monkeypatch.setattr(triton_attention_tiles, "FP8_KV_TILES", choice)
    bf16, fp32 = torch.zeros(1, dtype=torch.bfloat16), torch.zeros(1)
    assert triton_attention_tiles.f16_tiles(bf16, True) == tiles
    assert triton_attention_tiles.f16_tiles(bf16, False) == (False, False)  # no FP8 cache
    assert triton_attention_tiles.f16_tiles(fp32, True) == (False, False)  # fp32 stays exact


def test_an_unknown_choice_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(triton_attention_tiles, "FP8_KV_TILES", "fp8")
    with pytest.raises(ValueError, match="'bf16', 'fp16' or 'fp16 K'"):
        triton_attention_tiles.f16_tiles(torch.zeros(1, dtype=torch.bfloat16), True)
