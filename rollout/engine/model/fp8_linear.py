"""A projection's forward over FP8 weights: which GEMM reads which form of the weight, and of
its input when the inputs are rounded too (EngineConfig.activation_quantization). The forms are
made by `fp8_weights.quantize_model`; the fused q/k/v and gate/up forwards (fused_projections.py)
and every quantized nn.Linear come here."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from rollout.kernels import (  # noqa: F401 - register rollout::round_rows and ::w8a8_linear
    triton_rounded_rows,
    triton_w8a8_linear,
)
from rollout.kernels.linear_residual import plus_residual
from rollout.kernels.tiling import W8A8_MAX_ROWS


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias,
    fp8,
    triton_bf16: bool = False,
    rounded_input=None,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """x @ weight.T (+ bias), reading the FP8 form on CUDA where that pays (`triton_linear.fp8_pays`:
    every projection at a few rows, the wide ones at more); elsewhere `weight`, which holds the
    same values: by our bf16 decode GEMM with `triton_bf16`, else cuBLAS (and prefill's rows).
    With inputs rounded (activation_quantization="fp8" or "fp8-group"), x is rounded here
    (`triton_rounded_rows.round_rows`: one pass a row on CUDA, its twin elsewhere) and the FP8
    GEMM reads both forms; or, with `rounded_input` (x8, x_scale), x is rounded already (by a
    rounding norm or activation: rounded_layers.py) and that is its FP8 form. With `residual`:
    residual + that, added by the GEMM's kernel where one runs."""
    q, scale, input_scales = fp8
    if input_scales is not None:
        fp8_form_only = reads_fp8_form_only(x)
        if rounded_input is None:
            x, *rounded_input = torch.ops.rollout.round_rows(
                x, input_scales == "group", not fp8_form_only
            )
        x8, x_scale = rounded_input
        if fp8_form_only:
            return torch.ops.rollout.w8a8_linear(x8, x_scale, weight, bias, q, scale, residual)
        # more rows (prefill), or off CUDA: x, the rounded rows in its dtype, exactly
    if x.is_cuda:
        return torch.ops.rollout.decode_linear(x, weight, bias, q, scale, triton_bf16, residual)
    return plus_residual(F.linear(x, weight, bias), residual)


def reads_fp8_form_only(x: torch.Tensor) -> bool:
    """Whether `fp8_linear` over rounded inputs of x's shape reads only their FP8 form (the e4m3
    bytes and scales, by the FP8-MMA GEMM): on CUDA at 1 to W8A8_MAX_ROWS rows. There the
    rounding kernels are asked for no rows in x's dtype (`with_rows`), and x may be [..., 0]."""
    rows = math.prod(x.shape[:-1])
    return x.is_cuda and 0 < rows <= W8A8_MAX_ROWS


def fp8_linear_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """The forward `fp8_weights.quantize_model` gives a quantized nn.Linear (its `_fp8` form)."""
    if torch.is_grad_enabled():  # training: the plain nn.Linear, with gradients
        return self._plain_forward(x)
    # our bf16 decode GEMM where FP8 does not pay, for the linears routed to it (the LM head)
    return fp8_linear(x, self.weight, self.bias, self._fp8, getattr(self, "_decode_linear", False))
