"""The oracle of FP8 weights: a copy of a model whose projection and expert weights are their
FP8 values, chosen by parameter name (independently of the engine's own choice)."""

from __future__ import annotations

import copy

import torch

from rollout.kernels.torch_fp8 import dequantize_rows, quantize_rows


def expected_rounded(name: str) -> bool:
    """The decoder layers' projections and expert weights are FP8; embeddings, norms, routers
    (`mlp.gate`) and the LM head are not."""
    if ".layers." not in name:
        return False
    return name.endswith("_proj.weight") or name.endswith(
        ("experts.gate_up_proj", "experts.down_proj")
    )


def rounded_copy(model: torch.nn.Module) -> torch.nn.Module:
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for name, param in rounded.named_parameters():
            if expected_rounded(name):
                param.copy_(dequantize_rows(*quantize_rows(param), param.dtype))
    return rounded
