"""Attention backends behind one small interface, chosen once per engine by name."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from rollout.kernels import torch_paged_attention

if TYPE_CHECKING:
    from rollout.engine.forward_context import AttentionMetadata


class AttentionBackend(Protocol):
    name: str

    def write_kv(
        self,
        key: torch.Tensor,
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None: ...

    def attend(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor: ...


class TorchBackend:
    """The reference twin: gathers pages and runs fp32 attention per sequence (CPU path, oracle)."""

    name = "torch"

    def write_kv(self, key, value, k_cache, v_cache, slot_mapping) -> None:
        torch_paged_attention.write_kv(key, value, k_cache, v_cache, slot_mapping)

    def attend(self, query, k_cache, v_cache, meta, scale) -> torch.Tensor:
        return torch_paged_attention.paged_attention(
            query,
            k_cache,
            v_cache,
            meta.block_tables,
            meta.query_start_loc_host,
            meta.seq_lens_host,
            scale,
        )


_BACKENDS = {"torch": TorchBackend}


def resolve_attention_backend(name: str, device: torch.device) -> AttentionBackend:
    """ "auto" = Triton on CUDA when it is available, else the torch twin."""
    if name == "auto":
        name = "triton" if device.type == "cuda" and "triton" in _BACKENDS else "torch"
    if name == "triton" and device.type != "cuda":
        raise ValueError("attention='triton' needs a CUDA device; use attention='torch' or 'auto'")
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; available: {sorted(_BACKENDS)}")
    return _BACKENDS[name]()
