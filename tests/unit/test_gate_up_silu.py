"""`rollout::gate_up_silu_rounded` off the GPU: the unfused ops' FP8 form (what the MLP computed
before it), within an e4m3 step of the fp32 model's, and fake outputs (what torch.compile traces)
shaped as the real ones. Its kernels run in the interpreter check and on the GPU; which rows it
serves is for the GPU tests (on CPU it serves none)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rollout.kernels import torch_fp8, triton_gate_up_silu  # noqa: F401 - registers the op


def _arguments() -> tuple:
    g = torch.Generator().manual_seed(6)
    x8, x_scale = torch_fp8.quantize_rows(torch.randn(2, 3, 256, generator=g))
    q, scale = torch_fp8.quantize_rows(torch.randn(2 * 96, 256, generator=g) * 0.05)
    weight = (q.float() * scale[:, None]).bfloat16()
    return x8, x_scale, weight, q, scale


def test_off_the_gpu_the_op_is_the_unfused_ops() -> None:
    x8, x_scale, weight, q, scale = _arguments()
    got_q, got_scale = torch.ops.rollout.gate_up_silu_rounded(x8, x_scale, weight, q, scale)
    gate_up = torch.ops.rollout.w8a8_linear(x8, x_scale, weight, None, q, scale)
    _, want_q, want_scale = torch.ops.rollout.silu_mul_rounded(gate_up, False, False)
    assert got_q.shape == (2, 3, 96) and got_scale.shape == (2, 3)
    assert torch.equal(got_q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(got_scale, want_scale)
    # and the fp32 model's silu(gate) * up, to the e4m3 step of its rounding
    gate, up = (torch_fp8.dequantize_rows(x8, x_scale, torch.float32) @ weight.float().T).chunk(
        2, -1
    )
    exact = F.silu(gate) * up
    got = torch_fp8.dequantize_rows(got_q, got_scale, torch.float32)
    assert ((got - exact).abs() <= exact.abs() / 8 + got_scale[..., None] * 2.0**-6).all()


def test_the_fake_outputs_are_the_ops() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    args = _arguments()
    real = torch.ops.rollout.gate_up_silu_rounded(*args)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = torch.ops.rollout.gate_up_silu_rounded(*[mode.from_tensor(a) for a in args])
    assert [(t.shape, t.dtype) for t in fake] == [(t.shape, t.dtype) for t in real]
