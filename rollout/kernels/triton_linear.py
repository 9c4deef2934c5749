"""A GEMM for decode's few rows: y = x @ weight.T (+ bias) when x has at most 64 rows, from a
bf16/fp16 weight or from its FP8 form (e4m3 values with a scale per output row, `torch_fp8.py`).

At decode a projection multiplies one row per running sequence by a large weight, so its time is
the weight read. cuBLAS picks split-K kernels plus a reduction launch for the narrower outputs.
This kernel is faster than cuBLAS at decode's few rows for the output, down and LM-head
projections of the Llama-3-8B shapes, while q/k/v and gate/up are a little faster in cuBLAS
(`benchmarks/bench_gemm.py`; see docs/performance.md, 'Decode GEMMs'). The engine therefore routes
only those three projections here (`fused_projections.py`).

Each program owns BLOCK_N output columns for every row and walks K with a deep software
pipeline, so the weight streams once with many loads in flight. With `split_k` a column block's
K is sliced over that many programs, the last of which adds their partial sums in order. It runs
as the custom op `rollout::decode_linear`: opaque to torch.compile, and with more than 64 rows (a
prefill) it is plain `F.linear`. Over FP8 weights every projection comes here where FP8 pays
(`fp8_pays`).

With FP8 weights the weight tile is loaded as e4m3 (half the bytes: decode's floor halves) and
widened to the activations' dtype in registers, exactly; each fp32 accumulator column is scaled
once at the end. The engine keeps the weight itself as the values the FP8 form stands for, so the
F.linear of a prefill and this kernel compute the same model.

With FP8 activations as well (EngineConfig.activation_quantization="fp8") the rows come rounded
to e4m3 with a scale each, and both operands go to the tensor cores' FP8 MMA as stored, the rows'
and the columns' scales applied once at the end: the same kernel, launched by
`triton_w8a8_linear.w8a8_linear`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rollout.kernels.arrival_counters import ARRIVALS
from rollout.kernels.linear_residual import check_residual, plus_residual, residual_rows
from rollout.kernels.torch_fp8 import ACTIVATION_GROUP, FP8_DTYPE
from rollout.kernels.triton_fp8_widen import fast_widen, widen_e4m3
from rollout.kernels.triton_import import tl, triton

MAX_ROWS = 64


@triton.jit
def _decode_linear_kernel(
    x_ptr, w_ptr, s_ptr, xs_ptr, b_ptr, r_ptr, y_ptr, part_ptr, count_ptr, M, N, K, stride_xm,
    stride_wn, stride_ym, stride_rm, stride_xsm, FP8: tl.constexpr, X_FP8: tl.constexpr,
    X_GROUPS: tl.constexpr, IEEE: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    EVEN_K: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, FAST_WIDEN: tl.constexpr,
):  # fmt: skip
    pid_n = tl.program_id(0)
    block = tl.program_id(2) * tl.num_programs(0) + pid_n  # this (row, column) block's counter
    offs_m = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask = offs_m < M
    n_mask = offs_n < N
    # With SPLIT_K > 1 each program walks one K // SPLIT_K slice (launch() makes it a multiple
    # of BLOCK_K): more programs in flight for the narrow outputs.
    k_len = K // SPLIT_K
    k_begin = tl.program_id(1) * k_len
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(k_begin, k_begin + k_len, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = (offs_k < K) | EVEN_K  # no K masking when BLOCK_K divides K
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
            mask=m_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        w = tl.load(
            w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :],
            mask=n_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        if X_FP8 and X_GROUPS:  # a scale per row and BLOCK_K of K: each tile's products take
            # their rows' scales before joining the fp32 sums
            xs = tl.load(xs_ptr + offs_m * stride_xsm + k0 // BLOCK_K, mask=m_mask, other=0.0)
            acc += tl.dot(x, tl.trans(w), max_num_imprecise_acc=BLOCK_K) * xs[:, None]
        elif X_FP8:  # both in e4m3: the tensor cores' FP8 MMA, taken into fp32 every BLOCK_K
            acc = tl.dot(x, tl.trans(w), acc, max_num_imprecise_acc=BLOCK_K)
        else:
            if FP8:  # e4m3 -> bf16/fp16/fp32 is exact
                w = widen_e4m3(w, x.dtype, FAST_WIDEN, False)
            if IEEE:  # fp32 activations (exactness tests): no TF32 rounding
                acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
            else:
                acc = tl.dot(x, tl.trans(w), acc)
    if SPLIT_K > 1:
        # Each slice leaves its partial sums in the workspace; the last of a column block's
        # programs to arrive adds them in slice order (deterministic), finishes and re-arms the
        # block's counter for the next launch: one launch, no reduction kernel.
        part = part_ptr + offs_m[:, None] * N + offs_n[None, :]
        mn_mask = m_mask[:, None] & n_mask[None, :]
        tl.store(part + tl.program_id(1) * M * N, acc, mask=mn_mask)
        tl.debug_barrier()  # every thread's partial stores before the release below
        arrived = tl.atomic_add(count_ptr + block, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for s in range(SPLIT_K):  # .cg: read from L2, where the other programs wrote
                acc += tl.load(part + s * M * N, mask=mn_mask, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(count_ptr + block, 0)
            _finish(
                acc, s_ptr, xs_ptr, b_ptr, r_ptr, y_ptr, offs_m, offs_n, m_mask, n_mask,
                stride_ym, stride_rm, FP8, X_FP8 and not X_GROUPS, HAS_BIAS, HAS_RESIDUAL,
            )  # fmt: skip
    else:
        _finish(
            acc, s_ptr, xs_ptr, b_ptr, r_ptr, y_ptr, offs_m, offs_n, m_mask, n_mask, stride_ym,
            stride_rm, FP8, X_FP8 and not X_GROUPS, HAS_BIAS, HAS_RESIDUAL,
        )  # fmt: skip


@triton.jit
def _finish(acc, s_ptr, xs_ptr, b_ptr, r_ptr, y_ptr, offs_m, offs_n, m_mask, n_mask, stride_ym,
            stride_rm, FP8: tl.constexpr, ROW_SCALES: tl.constexpr, HAS_BIAS: tl.constexpr,
            HAS_RESIDUAL: tl.constexpr):  # fmt: skip
    mn_mask = m_mask[:, None] & n_mask[None, :]
    if FP8:
        acc *= tl.load(s_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
    if ROW_SCALES:  # FP8 activations with one scale a row
        acc *= tl.load(xs_ptr + offs_m, mask=m_mask, other=0.0)[:, None]
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    out = acc.to(y_ptr.dtype.element_ty)
    if HAS_RESIDUAL:
        # The layer's residual add, as torch adds two tensors of y's dtype: the product rounded
        # to that dtype first, the sum taken in fp32 and rounded once. So the sum's bits are
        # those of the GEMM followed by its own add, and the add's launch is gone.
        r = tl.load(r_ptr + offs_m[:, None] * stride_rm + offs_n[None, :], mask=mn_mask, other=0.0)
        out = (out.to(tl.float32) + r.to(tl.float32)).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], out, mask=mn_mask)


SHARED_MEMORY_BUDGET = 200 * 1024  # of the H200's 227 KiB per block, with room to spare


def _tiles(rows: int, n: int, weight_bytes: int = 2, x_bytes: int = 2) -> tuple[int, ...]:
    """(BLOCK_N, BLOCK_K, pipeline stages, K split, warps), from bench_gemm.py's sweeps on the H200:
    narrow outputs need narrow column blocks (more programs than SMs) and deep pipelines to keep
    loads in flight. Each stage holds an x and a weight tile in shared memory, so more rows
    leave room for fewer stages. FP8 weights, at up to 16 rows: K split in two for the narrow
    outputs (more programs in flight: 5-14% faster at 1-8 rows than unsplit), whole and in
    64-column blocks for the wide ones (gate/up: 7-8% faster at 8-16 rows than 32); at more
    rows, wider column blocks. fp32 activations (tests) take narrower K tiles to
    fit two stages."""
    block_n, block_k, stages, split_k = (32, 256, 6, 1) if n <= 16384 else (64, 128, 3, 1)
    if weight_bytes == 1 and rows <= FP8_NARROW_MAX_ROWS:
        block_n, block_k, stages, split_k = (
            (32, 256, 3, 2) if n < FP8_MIN_COLUMNS else (64, 256, 3, 1)
        )
    elif weight_bytes == 1:
        block_n, block_k, stages, split_k = 64, 128, 4, 1

    def stage_bytes() -> int:
        return (row_block(rows) * x_bytes + block_n * weight_bytes) * block_k

    while 2 * stage_bytes() > SHARED_MEMORY_BUDGET and block_k > 32:
        block_k //= 2
    return block_n, block_k, max(2, min(stages, SHARED_MEMORY_BUDGET // stage_bytes())), split_k, 4


def row_block(rows: int) -> int:
    return max(16, triton.next_power_of_2(rows))


def supported(weight: torch.Tensor) -> bool:
    """Whether decode_linear can use the Triton kernel for this weight (bf16/fp16, or FP8)."""
    return (
        weight.is_cuda
        and weight.dtype in (torch.bfloat16, torch.float16, FP8_DTYPE)
        and weight.stride(1) == 1
    )


# Where reading the FP8 weight pays (bench_gemm.py on one H200, Qwen3-8B's shapes, e4m3 widened
# by triton_fp8_widen; docs/performance.md): at 8 rows every output gains (us, FP8 against the
# better bf16 GEMM: q/k/v 13.5 / 16.6, o 10.8 / 12.2, gate/up 33.8 / 51.4, down 23.5 / 29.7), the
# narrow ones with K split in two; at 32 rows only the wide outputs (gate/up 40.2 / 52.0; q/k/v,
# o and down slower than bf16). More rows were not measured. Elsewhere the bf16 weight, which
# holds the same values, is read.
FP8_NARROW_MAX_ROWS = 16
FP8_MAX_ROWS = 32
FP8_MIN_COLUMNS = 16384


def fp8_pays(rows: int, n: int) -> bool:
    return 0 < rows <= FP8_NARROW_MAX_ROWS or (0 < rows <= FP8_MAX_ROWS and n >= FP8_MIN_COLUMNS)


@torch.library.custom_op("rollout::decode_linear", mutates_args=())
def decode_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    fp8_weight: torch.Tensor | None = None,
    fp8_scale: torch.Tensor | None = None,
    triton_bf16: bool = True,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """F.linear(x, weight, bias), by the Triton kernel when x has at most MAX_ROWS rows. With
    `fp8_weight` and `fp8_scale` (weight's FP8 form: weight == fp8_weight * fp8_scale) the kernel
    reads those where that pays (`fp8_pays`); otherwise, with `triton_bf16` False, F.linear (the
    projections where cuBLAS is the faster bf16 GEMM). More rows, or off CUDA: F.linear. With
    `residual` (the output's shape): residual + that, the add in the kernel's last step where
    the kernel runs (the same bits as the add after it)."""
    k = x.shape[-1]
    rows = x.numel() // k if k else 0
    check_residual(residual, x.shape[:-1], weight.shape[0], "decode_linear")
    if fp8_weight is not None and not fp8_pays(rows, weight.shape[0]):
        fp8_weight = fp8_scale = None
    if fp8_weight is None and not triton_bf16:
        return plus_residual(F.linear(x, weight, bias), residual)
    kernel_weight = weight if fp8_weight is None else fp8_weight
    # fp32 activations only over FP8 weights (the exactness tests of FP8 in fp32)
    dtypes = (torch.bfloat16, torch.float16) + ((torch.float32,) if fp8_weight is not None else ())
    if (
        rows == 0
        or rows > MAX_ROWS
        or not supported(kernel_weight)
        or x.dtype not in dtypes
        or x.dtype != weight.dtype
    ):
        return plus_residual(F.linear(x, weight, bias), residual)
    x2 = x.reshape(rows, k).contiguous()
    n = weight.shape[0]
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    tiles = _tiles(rows, n, kernel_weight.element_size(), x.element_size())
    r2, residual = residual_rows(residual, rows, n, y.dtype)
    launch(x2, kernel_weight, bias, y, *tiles, scale=fp8_scale, residual=r2)
    return plus_residual(y.view(*x.shape[:-1], n), residual)


def launch(
    x, weight, bias, y, block_n: int, block_k: int, stages: int, split_k: int = 1, warps: int = 4,
    *, scale=None, x_scale=None, block_m: int | None = None, residual=None,
) -> None:  # fmt: skip
    """y[M, N] = x[M, K] @ weight[N, K].T (+ bias) with the given tiles (bench_gemm.py sweeps
    them); with `scale` [N], weight is FP8 and y = (x @ weight.T) * scale (+ bias); with
    `x_scale` [M] too, x is FP8 as well, the product is the FP8 MMA's and each row of y is
    multiplied by its scale; with `x_scale` [M, ceil(K / block_k)], each row's products over a
    K tile are multiplied by that tile's scale (block_k must be ACTIVATION_GROUP). `split_k`
    slices K over that many programs per column block (whole BLOCK_K tiles each, else no
    split); `block_m` rows a program (default: all of them); with `residual` [M, N] (y's dtype,
    its rows contiguous), y = residual + that, added as torch adds (`_finish`)."""
    rows, k = x.shape
    n = weight.shape[0]
    x_groups = x_scale is not None and x_scale.dim() == 2
    if x_groups and (block_k != ACTIVATION_GROUP or x_scale.shape[1] != triton.cdiv(k, block_k)):
        raise ValueError(
            f"launch: x_scale {tuple(x_scale.shape)}, a scale a row and K tile, needs K tiles of "
            f"{ACTIVATION_GROUP} (block_k {block_k}) and {triton.cdiv(k, ACTIVATION_GROUP)} a row"
        )
    block_m = block_m or row_block(rows)
    column_blocks, row_blocks = triton.cdiv(n, block_n), triton.cdiv(rows, block_m)
    if split_k > 1 and k % (split_k * block_k) == 0:
        counters = ARRIVALS.get(x.device, column_blocks * row_blocks)  # None: no split
        split_k = split_k if counters is not None else 1
    else:
        split_k, counters = 1, None
    partials = (
        y if split_k == 1 else torch.empty(split_k, rows, n, dtype=torch.float32, device=x.device)
    )
    _decode_linear_kernel[(column_blocks, split_k, row_blocks)](
        x, weight, scale if scale is not None else y, x_scale if x_scale is not None else y,
        bias if bias is not None else y, residual if residual is not None else y, y, partials,
        counters if counters is not None else y, rows, n, k, x.stride(0), weight.stride(0),
        y.stride(0), residual.stride(0) if residual is not None else 0,
        x_scale.stride(0) if x_groups else 0,
        FP8=scale is not None, X_FP8=x_scale is not None, X_GROUPS=x_groups,
        IEEE=y.dtype == torch.float32, HAS_BIAS=bias is not None,
        HAS_RESIDUAL=residual is not None, EVEN_K=k % block_k == 0,
        SPLIT_K=split_k, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        FAST_WIDEN=scale is not None and fast_widen(y.dtype, x.device),
        num_warps=warps, num_stages=stages,
    )  # fmt: skip


def prepare_split_k(device: torch.device) -> None:
    """Make the counters of the current stream now, outside any CUDA graph capture (where none can
    be made)."""
    ARRIVALS.get(device, 1)


@decode_linear.register_fake
def _(
    x, weight, bias, fp8_weight=None, fp8_scale=None, triton_bf16=True, residual=None
) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])
