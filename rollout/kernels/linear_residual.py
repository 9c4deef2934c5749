"""The residual add a decode GEMM folds into its last step (`y = residual + x @ weight.T`), shared
by the bf16/FP8-weight kernel (`triton_linear`) and the W8A8 one (`triton_w8a8_linear`): the
shape check, the rows the kernel reads, and the plain add where the kernel cannot take it."""

from __future__ import annotations

import torch


def check_residual(residual, leading: torch.Size, n: int, op: str) -> None:
    if residual is not None and residual.shape != (*leading, n):
        raise ValueError(
            f"{op}: residual {tuple(residual.shape)} must have the output's shape {(*leading, n)}"
        )


def residual_rows(residual, rows: int, n: int, dtype: torch.dtype):
    """(residual as [rows, n] rows for the kernel's last step, None) where the kernel can add
    it (y's dtype), else (None, residual): the caller adds it after."""
    if residual is None or residual.dtype != dtype:
        return None, residual
    r2 = residual.reshape(rows, n)
    return (r2 if r2.stride(1) == 1 else r2.contiguous()), None


def plus_residual(out: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
    return out if residual is None else residual + out
