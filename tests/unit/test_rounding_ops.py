"""The rounding ops of FP8 activations (`triton_rounded_rows`) without the rounded rows in the
activations' dtype (`with_rows=False`, what decode's FP8-MMA GEMMs need): y is [..., 0], the
e4m3 bytes and scales are those the ops give with the rows, and the ops' fake outputs (what
torch.compile traces) agree with them. On CPU the ops run their twins; the kernels' own
`with_rows` runs in the interpreter check and on the GPU."""

from __future__ import annotations

import pytest
import torch

from rollout.kernels import triton_rounded_rows  # noqa: F401 - registers the ops

OPS = ["rms_norm_rounded", "add_rms_norm_rounded", "silu_mul_rounded", "round_rows"]


def _arguments(op: str, grouped: bool) -> tuple:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 300, generator=g)
    weight = torch.randn(300, generator=g)
    return {
        "rms_norm_rounded": (x, weight, 1e-6, grouped),
        "add_rms_norm_rounded": (x, torch.randn(2, 3, 300, generator=g), weight, 1e-6, grouped),
        "silu_mul_rounded": (torch.randn(2, 3, 600, generator=g), grouped),
        "round_rows": (x, grouped),
    }[op]


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("op", OPS)
def test_without_rows_the_fp8_form_is_the_same(op: str, grouped: bool) -> None:
    function = getattr(torch.ops.rollout, op)
    args = _arguments(op, grouped)
    full, bare = function(*args), function(*args, False)
    *h, y, q, scale = full
    *bare_h, bare_y, bare_q, bare_scale = bare
    assert y.shape == (2, 3, 300) and bare_y.shape == (2, 3, 0)
    assert torch.equal(bare_q.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(bare_scale, scale)
    assert all(torch.equal(a, b) for a, b in zip(bare_h, h, strict=True))


@pytest.mark.parametrize("with_rows", [False, True])
@pytest.mark.parametrize("op", OPS)
def test_the_fake_outputs_are_the_ops(op: str, with_rows: bool) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    function = getattr(torch.ops.rollout, op)
    args = (*_arguments(op, True), with_rows)
    real = function(*args)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        fake = function(*fake_args)
    assert [(t.shape, t.dtype) for t in fake] == [(t.shape, t.dtype) for t in real]
