"""Launch settings shared by the Triton kernels and the host code that builds their launch metadata."""

import torch

EXTEND_BLOCK_M = 64
"""Query rows per prefill/extend program: the host splits each sequence's chunk into q-blocks."""


def dot_precision(query: torch.Tensor) -> str:
    """Precision of tl.dot: fp32 models (tests, exactness) get full-precision dots; bf16/fp16
    inputs ignore the setting."""
    return "ieee" if query.dtype == torch.float32 else "tf32"
