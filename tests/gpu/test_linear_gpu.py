"""The decode GEMM (rollout::decode_linear) on the GPU: against F.linear, and routed in a model."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from rollout.engine.model.fused_projections import fuse_projections, route_decode_linears
from tests.conftest import tiny_model

pytestmark = pytest.mark.gpu
# Collected on machines without triton too (and skipped there, like every GPU test).
triton_linear = pytest.importorskip("rollout.kernels.triton_linear", exc_type=ImportError)


def _rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "rows,n,k",
    # decode batch sizes up to the cap, ragged N and K, w1's widest shapes
    [(1, 4096, 4096), (7, 1000, 896), (32, 4096, 14336), (64, 6144, 4096), (32, 128256, 4096)],
)
def test_decode_linear_matches_f_linear(rows: int, n: int, k: int, dtype: torch.dtype) -> None:
    g = torch.Generator(device="cuda").manual_seed(rows)
    x = torch.randn(1, rows, k, device="cuda", dtype=dtype, generator=g)
    weight = torch.randn(n, k, device="cuda", dtype=dtype, generator=g) * 0.02
    bias = torch.randn(n, device="cuda", dtype=dtype, generator=g)
    for b in (None, bias):
        got = torch.ops.rollout.decode_linear(x, weight, b)
        assert got.shape == (1, rows, n)
        assert (
            _rel_error(got, F.linear(x.float(), weight.float(), None if b is None else b.float()))
            < 1e-2
        )


def test_more_rows_than_the_cap_use_f_linear(monkeypatch) -> None:
    def must_not_launch(*args, **kwargs):
        raise AssertionError("the Triton kernel ran for a prefill-sized input")

    monkeypatch.setattr(triton_linear, "launch", must_not_launch)
    x = torch.randn(triton_linear.MAX_ROWS + 1, 256, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(512, 256, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(torch.ops.rollout.decode_linear(x, weight, None), F.linear(x, weight))


def test_routed_model_matches_and_trains_through_plain_linears(monkeypatch) -> None:
    model = tiny_model("llama").to("cuda", torch.bfloat16)
    model.set_attn_implementation("sdpa")
    routed = copy.deepcopy(model)
    fuse_projections(routed)
    layers = routed.config.num_hidden_layers
    assert route_decode_linears(routed) == 2 * layers + 1  # o_proj and down each layer, the head
    launches = []
    real_launch = triton_linear.launch
    monkeypatch.setattr(
        triton_linear, "launch", lambda *a, **kw: launches.append(1) or real_launch(*a, **kw)
    )
    ids = torch.randint(0, model.config.vocab_size, (1, 24), device="cuda")
    with torch.no_grad():
        want = model(input_ids=ids, use_cache=False).logits
        got = routed(input_ids=ids, use_cache=False).logits
    assert len(launches) == 2 * layers + 1
    assert _rel_error(got, want) < 2e-2
    # With autograd on, the plain modules run and the head's weight gets its gradient.
    launches.clear()
    routed.lm_head.weight.requires_grad_(True)
    routed(input_ids=ids, use_cache=False).logits.float().sum().backward()
    assert not launches and routed.lm_head.weight.grad is not None


@pytest.mark.parametrize(
    "rows,n,k", [(1, 4096, 4096), (7, 1000, 896), (32, 4096, 14336), (64, 128256, 4096)]
)
def test_fp8_linear_matches_its_twin(rows: int, n: int, k: int, monkeypatch) -> None:
    """FP8 weights (e4m3, a scale per output row) at decode's rows: the kernel against the
    dequantized weights' fp32 GEMM, bf16 activations."""
    from rollout.kernels import triton_linear
    from rollout.kernels.torch_fp8 import FP8_DTYPE, fp8_linear_reference, round_to_fp8_
    from rollout.kernels.triton_linear import decode_linear, supported

    monkeypatch.setattr(triton_linear, "FP8_MIN_COLUMNS", 0)  # every shape through the kernel
    monkeypatch.setattr(triton_linear, "FP8_MAX_ROWS", 64)

    g = torch.Generator(device="cuda").manual_seed(rows)
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16, generator=g)
    weight = (torch.randn(n, k, device="cuda", generator=g) * 0.02).bfloat16()
    q = torch.empty(n, k, device="cuda", dtype=FP8_DTYPE)
    scale = torch.empty(n, device="cuda")
    round_to_fp8_(weight, q, scale)
    assert supported(q)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=g)
    for b in (None, bias):
        got = decode_linear(x, weight, b, q, scale)
        want = fp8_linear_reference(x.float(), q, scale, None if b is None else b.float())
        assert _rel_error(got, want) < 1e-2
        # the same model as the rounded bf16 weight's GEMM (cuBLAS), to bf16 precision
        assert _rel_error(got, torch.nn.functional.linear(x, weight, b)) < 1e-2


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("split_k", [2, 4, 8])
def test_split_k_matches_and_repeats_in_a_graph(split_k: int, fp8: bool) -> None:
    """K sliced over programs: the last program of each column block adds the slices in order, so
    a replayed graph gives the same bits each time, and the counters stay armed across launches."""
    from rollout.kernels.torch_fp8 import FP8_DTYPE, fp8_linear_reference, round_to_fp8_

    g = torch.Generator(device="cuda").manual_seed(split_k)
    rows, n, k = 8, 4096, 4096
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16, generator=g)
    weight = (torch.randn(n, k, device="cuda", generator=g) * 0.02).bfloat16()
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=g)
    scale = None
    want = F.linear(x.float(), weight.float(), bias.float())
    if fp8:
        q, scale = torch.empty(n, k, device="cuda", dtype=FP8_DTYPE), torch.empty(n, device="cuda")
        round_to_fp8_(weight, q, scale)
        want = fp8_linear_reference(x.float(), q, scale, bias.float())
        weight = q
    y = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)

    def run() -> None:
        triton_linear.launch(x, weight, bias, y, 32, 256, 4, split_k, scale=scale)

    run()
    first = y.clone()
    assert _rel_error(first, want) < 1e-2
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()  # the warm-up that makes this stream's split-K counters, as the engine's does
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(3):
            run()
    for _ in range(5):
        y.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, first)


def _count_w8a8_launches(monkeypatch) -> list[int]:
    from rollout.kernels import triton_linear

    launches = []
    launch = triton_linear.launch

    def counting(*args, x_scale=None, **kwargs):
        launches.append(x_scale is not None)
        return launch(*args, x_scale=x_scale, **kwargs)

    monkeypatch.setattr(triton_linear, "launch", counting)
    return launches


@pytest.mark.parametrize("rows", [1, 16, 17, 32, 64, 65, 100, 128, 129])
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 12288), (24576, 4096), (1000, 896)])
@pytest.mark.parametrize("scales", ["row", "group"])
def test_w8a8_linear_matches_its_twin(rows: int, n: int, k: int, scales: str, monkeypatch) -> None:
    """FP8 activations (a power-of-two scale per row, or per row and 128 of K) times FP8
    weights: the FP8-MMA kernel at 1 to 128 rows (one row block, or several), F.linear over the
    dequantized rows at more; each against the fp32 GEMM of the dequantized operands, whose
    products are the same exactly."""
    from rollout.kernels import triton_w8a8_linear
    from rollout.kernels.torch_fp8 import (
        FP8_DTYPE,
        dequantize_groups,
        dequantize_rows,
        quantize_groups,
        quantize_rows,
        round_to_fp8_,
    )

    quantize, dequantize = {
        "row": (quantize_rows, dequantize_rows),
        "group": (quantize_groups, dequantize_groups),
    }[scales]
    launches = _count_w8a8_launches(monkeypatch)
    g = torch.Generator(device="cuda").manual_seed(rows * 7 + n)
    x = torch.randn(rows, k, device="cuda", generator=g)
    x[0] *= 1e-3  # rows of other magnitudes keep scales of their own
    x[-1, 128:256] *= 64  # and groups (with group scales)
    x = x.bfloat16()
    weight = (torch.randn(n, k, device="cuda", generator=g) * 0.02).bfloat16()
    q = torch.empty(n, k, device="cuda", dtype=FP8_DTYPE)
    scale = torch.empty(n, device="cuda")
    round_to_fp8_(weight, q, scale)
    x8, x_scale = quantize(x)
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=g)
    for b in (None, bias):
        got = triton_w8a8_linear.w8a8_linear(x8, x_scale, weight, b, q, scale)
        assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
        want = F.linear(dequantize(x8, x_scale, torch.float32), weight.float())
        want = want if b is None else want + b.float()
        assert _rel_error(got, want) < 5e-3, rows
        assert _rel_error(got[:1], want[:1]) < 5e-3  # the small row is not lost beside the rest
    served = rows <= triton_w8a8_linear.W8A8_MAX_ROWS
    library = triton_w8a8_linear.library_gemm_pays(
        rows, n, k, scales == "group", None, torch.bfloat16, None, scale, x.device
    )
    if library:  # torch's FP8 GEMM, no launch of ours
        assert served and n >= 16384 and rows >= 65 and scales == "row" and not launches
    else:
        assert launches == [True, True] if served else not launches


def _down_shaped(rows: int):
    """(generator, x [rows, 12288] bf16, a down-shaped weight rounded to FP8, its e4m3 form and
    row scales)."""
    from rollout.kernels.torch_fp8 import FP8_DTYPE, round_to_fp8_

    g = torch.Generator(device="cuda").manual_seed(rows)
    x = torch.randn(rows, 12288, device="cuda", dtype=torch.bfloat16, generator=g)
    weight = (torch.randn(4096, 12288, device="cuda", generator=g) * 0.02).bfloat16()
    q = torch.empty(4096, 12288, device="cuda", dtype=FP8_DTYPE)
    scale = torch.empty(4096, device="cuda")
    round_to_fp8_(weight, q, scale)
    return g, x, weight, q, scale


@pytest.mark.parametrize("rows", [24, 100])
@pytest.mark.parametrize("scales", ["row", "group"])
def test_w8a8_split_k_repeats_in_a_graph(rows: int, scales: str) -> None:
    """The FP8-activation launches split K too (here a down-shaped output, over one row block
    and over two): a replayed graph gives the eager launch's bits every time."""
    from rollout.kernels.torch_fp8 import quantize_groups, quantize_rows
    from rollout.kernels.triton_w8a8_linear import w8a8_linear

    quantize = quantize_groups if scales == "group" else quantize_rows
    _, x, weight, q, scale = _down_shaped(rows)
    x8, x_scale = quantize(x)
    eager = w8a8_linear(x8, x_scale, weight, None, q, scale)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        w8a8_linear(x8, x_scale, weight, None, q, scale)  # makes this stream's counters
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = w8a8_linear(x8, x_scale, weight, None, q, scale)
    for _ in range(4):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)


@pytest.mark.parametrize("rows", [65, 128])
def test_the_library_gemm_of_wide_outputs_repeats_in_a_graph(rows: int, monkeypatch) -> None:
    """A gate/up-shaped output from LIBRARY_MIN_ROWS rows goes to torch's FP8 GEMM (no launch of
    ours), and a replayed graph of it gives the eager call's bits."""
    from rollout.kernels import triton_w8a8_linear
    from rollout.kernels.torch_fp8 import FP8_DTYPE, quantize_rows, round_to_fp8_

    monkeypatch.setattr(triton_w8a8_linear, "LIBRARY_MIN_ROWS", 65)  # the route, on or not

    g = torch.Generator(device="cuda").manual_seed(rows)
    x8, x_scale = quantize_rows(torch.randn(rows, 4096, device="cuda", generator=g).bfloat16())
    weight = (torch.randn(24576, 4096, device="cuda", generator=g) * 0.02).bfloat16()
    q = torch.empty_like(weight, dtype=FP8_DTYPE)
    scale = torch.empty(24576, device="cuda")
    round_to_fp8_(weight, q, scale)
    launches = _count_w8a8_launches(monkeypatch)
    eager = triton_w8a8_linear.w8a8_linear(x8, x_scale, weight, None, q, scale)
    assert not launches
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        triton_w8a8_linear.w8a8_linear(x8, x_scale, weight, None, q, scale)
    with torch.cuda.graph(graph, stream=stream):
        out = triton_w8a8_linear.w8a8_linear(x8, x_scale, weight, None, q, scale)
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)


@pytest.mark.parametrize("rows", [1, 8, 16, 24, 64, 100, 129])
@pytest.mark.parametrize("scales", [None, "row", "group"])
def test_a_residual_added_in_the_kernel_gives_the_adds_bits(rows: int, scales) -> None:
    """Down's GEMM under FP8 weights (`scales` None) and FP8 activations adds the layer's
    residual in its last step: the same bits as the GEMM and then torch's add, K split or not,
    on the FP8-weight kernel (FP8 weights alone, up to 16 rows), the FP8-MMA kernel (FP8
    activations, 1-128) and F.linear (129)."""
    from rollout.kernels.torch_fp8 import quantize_groups, quantize_rows
    from rollout.kernels.triton_w8a8_linear import w8a8_linear

    g, x, weight, q, scale = _down_shaped(rows)
    residual = torch.randn(rows, 4096, device="cuda", dtype=torch.bfloat16, generator=g) * 4
    if scales is None:
        plain = triton_linear.decode_linear(x, weight, None, q, scale)
        summed = triton_linear.decode_linear(x, weight, None, q, scale, True, residual)
    else:
        x8, x_scale = (quantize_rows if scales == "row" else quantize_groups)(x)
        plain = w8a8_linear(x8, x_scale, weight, None, q, scale)
        summed = w8a8_linear(x8, x_scale, weight, None, q, scale, residual)
    assert torch.equal(summed, residual + plain)
