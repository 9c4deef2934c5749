"""Paged-attention kernels: Triton kernels for CUDA and their PyTorch reference twins.

registry.py                 attention backends by name ("torch", "triton") behind one interface
attention_metadata.py       what a step's attention reads besides q/k/v
torch_paged_attention.py    the PyTorch reference twin (CPU path, test oracle)
triton_paged_attention.py   KV write and prefill/extend; the Triton backend's surface (CUDA)
triton_decode_attention.py  split-KV decode, merged in the same launch
triton_attention_tiles.py   per K/V tile: the paged read and the online-softmax fold
triton_sampler.py           one-pass sampling for rows without top-k/top-p/min-p
triton_linear.py            decode_linear: a GEMM for decode's few rows (bf16 or FP8 weights)
triton_w8a8_linear.py       w8a8_linear: FP8 rows and weights on the FP8 MMA (the same kernel)
torch_fp8.py                FP8 weights: e4m3, power-of-two row scales, the GEMM's twin
triton_rounded_rows.py      RMSNorm and silu(gate) * up with their outputs rounded to e4m3 (FP8
                            activations), one pass a row
torch_rounded_rows.py       their PyTorch twins
triton_qk_rope.py           qk_norm_rope: Qwen3's per-head q/k RMSNorm and rotary in one launch
torch_qk_rope.py            its PyTorch twin
triton_routing.py           top_k_routing: an MoE router's softmax and top-k in one launch
triton_moe.py               fused_experts: MoE experts, each touched expert read once per step
triton_expert_sort.py       the step's (token, expert) pairs in expert order: a counting sort
torch_moe.py                the PyTorch reference twins of both (test oracles)
tiling.py                   launch settings the host code shares (no torch), the decode tiles
arrival_counters.py         the zeroed counters by which a kernel's last program finishes
gpu_features.py             what the device offers: compiled NVIDIA Triton, the e4m3 instructions
triton_import.py            Triton, or where it is not installed a stand-in the modules load with
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollout.kernels.registry import AttentionBackend, resolve_attention_backend

__all__ = ["AttentionBackend", "resolve_attention_backend"]


def __getattr__(name: str) -> Any:
    # Loaded on first use: rollout.kernels.tiling is read by the torch-free scheduling part.
    if name in __all__:
        from rollout.kernels import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'rollout.kernels' has no attribute {name!r}")
