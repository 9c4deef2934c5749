"""How an FP8 cache is read: which tiles its keys widen to (`triton_attention_tiles.fp16_keys`)
and how long the decode kernel's pieces get at a full batch."""

from __future__ import annotations

import pytest
import torch

from rollout.kernels import triton_attention_tiles
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


def test_an_fp8_cache_takes_longer_pieces_only_at_a_full_batch() -> None:
    full = DECODE_TILES.splits_per_sequence(128, 8)
    assert full == 1
    assert DECODE_TILES.longest_piece(full) == 1024
    assert DECODE_TILES.longest_piece(full, fp8_kv=True) == 2048
    few = DECODE_TILES.splits_per_sequence(2, 8)
    assert few > 1
    assert DECODE_TILES.longest_piece(few, fp8_kv=True) == DECODE_TILES.split_len
