"""FP8 weights (rollout/kernels/torch_fp8.py): the e4m3 rounding with per-row scales, and the
GEMM entry point off the GPU (the Triton kernel itself: tests/triton_interpreter_check.py and the
GPU tests)."""

from __future__ import annotations

import pytest
import torch

from rollout.kernels.torch_fp8 import (
    ACTIVATION_GROUP,
    FP8_DTYPE,
    FP8_MAX,
    dequantize_groups,
    dequantize_rows,
    fp8_linear_reference,
    quantize_groups,
    quantize_rows,
    round_to_fp8_,
)


def test_each_row_uses_the_whole_range_and_rounds_within_e4m3s_precision() -> None:
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 200, generator=g) * torch.logspace(-3, 1, 48)[:, None]
    weight[7] = 0.0
    q, scale = quantize_rows(weight)
    assert q.dtype == FP8_DTYPE and q.shape == weight.shape and scale.shape == (48,)
    assert scale[7] == 1.0 and torch.all(q[7].float() == 0)
    rows = [r for r in range(48) if r != 7]
    # the largest magnitude of every row lands in the format's top binade
    top = q[rows].float().abs().amax(dim=1)
    assert torch.all((top >= 224) & (top <= FP8_MAX))
    back = dequantize_rows(q, scale, torch.float32)
    # 3 mantissa bits: half a step is 1/16 of the value; below 2^-6 (subnormals) a fixed step
    bound = torch.maximum(weight.abs() / 16, scale[:, None] * 2.0**-10)
    assert torch.all((back - weight).abs() <= bound * (1 + 1e-6))


def test_expert_weights_get_one_scale_per_expert_row() -> None:
    experts = torch.randn(4, 6, 32)
    q, scale = quantize_rows(experts)
    assert q.shape == experts.shape and scale.shape == (4, 6)
    assert torch.allclose(dequantize_rows(q, scale, torch.float32), experts, rtol=0.07, atol=1e-3)


def test_groups_of_a_row_round_as_rows_of_their_own() -> None:
    """quantize_groups: each 128 inputs of a row (the last group shorter) get the scale a row of
    them alone would, and the round trip is idempotent."""
    g = torch.Generator().manual_seed(3)
    k = 2 * ACTIVATION_GROUP + 44
    x = torch.randn(2, 3, k, generator=g) * torch.tensor([1e-4, 1.0, 1e3])[:, None]
    x[0, 0, ACTIVATION_GROUP : 2 * ACTIVATION_GROUP] = 0.0
    q, scale = quantize_groups(x)
    assert q.dtype == FP8_DTYPE and q.shape == x.shape and scale.shape == (2, 3, 3)
    for start in range(0, k, ACTIVATION_GROUP):
        group = x[..., start : start + ACTIVATION_GROUP]
        q_alone, scale_alone = quantize_rows(group)
        assert torch.equal(scale[..., start // ACTIVATION_GROUP], scale_alone)
        assert torch.equal(q[..., start : start + ACTIVATION_GROUP].float(), q_alone.float())
    back = dequantize_groups(q, scale, torch.float32)
    assert torch.equal(dequantize_groups(*quantize_groups(back), torch.float32), back)
    assert torch.equal(back.bfloat16().float(), back)  # exact in bf16
    with pytest.raises(ValueError, match="3 scales a row for 100 elements"):
        dequantize_groups(q[..., :100], scale, torch.float32)


def test_the_fp8_gemm_off_the_gpu_is_the_rounded_weights_gemm() -> None:
    from rollout.kernels.triton_linear import decode_linear

    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 64, generator=g)
    weight = torch.randn(40, 64, generator=g)
    q, scale = torch.empty(40, 64, dtype=FP8_DTYPE), torch.empty(40)
    round_to_fp8_(weight, q, scale)
    bias = torch.randn(40, generator=g)
    y = decode_linear(x, weight, bias, q, scale)
    assert y.shape == (3, 5, 40) and torch.equal(y, torch.nn.functional.linear(x, weight, bias))
    torch.testing.assert_close(y, fp8_linear_reference(x, q, scale, bias), rtol=1e-5, atol=1e-5)


def test_the_gemm_ops_add_a_residual_of_the_outputs_shape_and_refuse_another() -> None:
    """A layer's residual add handed to the GEMM (the MLP's down projection under FP8
    activations): off the GPU both ops add it after F.linear, as the kernels do in their last
    step; a residual of another shape is a caller's error, not a broadcast."""
    from rollout.kernels.torch_fp8 import quantize_rows
    from rollout.kernels.triton_linear import decode_linear
    from rollout.kernels.triton_w8a8_linear import w8a8_linear

    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 64, generator=g).bfloat16()
    weight = torch.randn(40, 64, generator=g).bfloat16()
    q, scale = torch.empty(40, 64, dtype=FP8_DTYPE), torch.empty(40)
    round_to_fp8_(weight, q, scale)
    residual = torch.randn(2, 3, 40, generator=g).bfloat16()
    plain = decode_linear(x, weight, None, q, scale)
    assert torch.equal(decode_linear(x, weight, None, q, scale, True, residual), residual + plain)
    x8, x_scale = quantize_rows(x)
    plain = w8a8_linear(x8, x_scale, weight, None, q, scale)
    assert torch.equal(w8a8_linear(x8, x_scale, weight, None, q, scale, residual), residual + plain)
    with pytest.raises(ValueError, match=r"residual \(3, 40\) must have the output's shape"):
        decode_linear(x, weight, None, q, scale, True, residual[0])
    with pytest.raises(ValueError, match="w8a8_linear: residual"):
        w8a8_linear(x8, x_scale, weight, None, q, scale, residual[:, :1])


def test_scales_are_powers_of_two_so_the_rounded_weight_is_exact_in_bf16() -> None:
    g = torch.Generator().manual_seed(2)
    weight = torch.randn(64, 96, generator=g) * torch.logspace(-5, 3, 64)[:, None]
    q, scale = quantize_rows(weight)
    mantissa, _ = torch.frexp(scale)
    assert torch.all(mantissa == 0.5)
    # every row's largest value lands in e4m3's top binade
    top = q.float().abs().amax(dim=1)
    assert torch.all((top >= 224) & (top <= FP8_MAX))
    exact = dequantize_rows(q, scale, torch.float64)
    assert torch.equal(dequantize_rows(q, scale, torch.bfloat16).double(), exact)


def test_rounding_in_place_is_idempotent_and_keeps_the_storage() -> None:
    g = torch.Generator().manual_seed(3)
    weight = (torch.randn(3, 70, 50, generator=g) * 3).bfloat16()
    storage = weight.data_ptr()
    q = torch.empty(weight.shape, dtype=FP8_DTYPE)
    scale = torch.empty(3, 70)
    round_to_fp8_(weight, q, scale)
    assert weight.data_ptr() == storage
    assert torch.equal(weight, dequantize_rows(q, scale, torch.bfloat16))
    once = weight.clone()
    round_to_fp8_(weight, q, scale)  # a sync that resends the same weights changes nothing
    assert torch.equal(weight, once)


def test_fp8_is_read_only_where_it_paid_on_the_gpu() -> None:
    from rollout.kernels.triton_linear import fp8_pays

    assert fp8_pays(1, 24576) and fp8_pays(16, 151936) and fp8_pays(32, 24576)
    assert fp8_pays(8, 6144)  # q/k/v with K split in two
    assert not fp8_pays(32, 6144)  # q/k/v at 32 rows: no faster than bf16
    assert not fp8_pays(33, 24576) and not fp8_pays(0, 24576)
