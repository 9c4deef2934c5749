"""Paged-attention kernels: Triton kernels for CUDA and their PyTorch reference twins."""

from rollout.kernels.registry import AttentionBackend, resolve_attention_backend

__all__ = ["AttentionBackend", "resolve_attention_backend"]
