"""Attention backends behind one small interface, chosen once per engine by name."""

from __future__ import annotations

from typing import Protocol

import torch

from rollout.kernels import torch_paged_attention
from rollout.kernels.attention_metadata import AttentionMetadata


class AttentionBackend(Protocol):
    name: str

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        k_scale: torch.Tensor | None = None,
        v_scale: torch.Tensor | None = None,
    ) -> None:
        """Keys and values into their slots; with an FP8 cache (the scales given), each
        (token, head) row in e4m3 with its power-of-two scale (`torch_fp8.quantize_kv`)."""
        ...

    def attend(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        window: int | None = None,
        softcap: float | None = None,
        sinks: torch.Tensor | None = None,
        kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Attention over the paged cache: causal, within the last `window` positions when set,
        logits capped at `softcap`, and per-head `sinks` [num_heads] in the denominator; an FP8
        cache's keys and values widened by their `kv_scales` (k_scale, v_scale)."""
        ...


class TorchBackend:
    """The reference twin: gathers pages and runs fp32 attention per sequence (CPU path, oracle)."""

    name = "torch"

    def write_kv(
        self, key, value, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None
    ) -> None:
        torch_paged_attention.write_kv(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)

    def attend(
        self, query, k_cache, v_cache, meta, scale, window=None, softcap=None, sinks=None,
        kv_scales=None,
    ) -> torch.Tensor:  # fmt: skip
        return torch_paged_attention.paged_attention(
            query,
            k_cache,
            v_cache,
            meta.block_tables,
            meta.query_start_loc_host,
            meta.seq_lens_host,
            scale,
            window=window,
            softcap=softcap,
            sinks=sinks,
            kv_scales=kv_scales,
        )


MAX_DECODE_ROWS = 64
"""Query rows (tokens x heads of a KV head's group) the decode kernel takes for a step with more
than one token per sequence; beyond it the extend kernel runs."""


class TritonBackend:
    """Triton kernels (CUDA): split-KV decode for decode steps and for verification steps laid
    out for their graphs (the same few tokens per sequence), the extend kernel otherwise."""

    name = "triton"

    def __init__(self) -> None:
        from rollout.kernels import triton_paged_attention

        self._kernels = triton_paged_attention

    def write_kv(
        self, key, value, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None
    ) -> None:
        self._kernels.write_kv(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)

    def attend(
        self, query, k_cache, v_cache, meta, scale, window=None, softcap=None, sinks=None,
        kv_scales=None,
    ) -> torch.Tensor:  # fmt: skip
        variant = dict(window=window, softcap=softcap, sinks=sinks, kv_scales=kv_scales)
        query_len = meta.uniform_query_len
        group = query.shape[1] // k_cache.shape[2]
        # The decode kernel holds every query row of a KV head in one program: one token per
        # sequence always, a few (a verification step) while that stays at most 64 rows.
        if query_len == 1 or (query_len > 1 and query_len * group <= MAX_DECODE_ROWS):
            return self._kernels.decode_attention(
                query,
                k_cache,
                v_cache,
                meta.block_tables,
                meta.seq_lens,
                scale,
                meta.max_model_len,
                query_len=query_len,
                **variant,
            )
        return self._kernels.extend_attention(
            query,
            k_cache,
            v_cache,
            meta.block_tables,
            meta.query_start_loc,
            meta.seq_lens,
            meta.q_block_seq,
            meta.q_block_start,
            scale,
            **variant,
        )


_BACKENDS = {"torch": TorchBackend, "triton": TritonBackend}


def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_attention_backend(name: str, device: torch.device) -> AttentionBackend:
    """ "auto" = Triton on CUDA when it is available, else the torch twin."""
    if name == "auto":
        name = "triton" if device.type == "cuda" and _triton_available() else "torch"
    if name == "triton" and device.type != "cuda":
        raise ValueError("attention='triton' needs a CUDA device; use attention='torch' or 'auto'")
    if name == "triton" and not _triton_available():
        raise ValueError("attention='triton' needs the triton package; use attention='torch'")
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; available: {sorted(_BACKENDS)}")
    return _BACKENDS[name]()
