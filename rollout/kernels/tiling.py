"""Launch settings shared by the Triton kernels and the host code that builds their launch metadata.

No torch here: the host-only scheduling part reads it.
"""

EXTEND_BLOCK_M = 64
"""Query rows per prefill/extend program: the host splits each sequence's chunk into q-blocks."""

W8A8_MIN_ROWS = 17
W8A8_MAX_ROWS = 128
"""The rows at which a GEMM over FP8 activations and weights runs on the FP8 MMA
(`triton_w8a8_linear.w8a8_linear`); at fewer the FP8-weight kernel over the rounded rows is
faster, at more (prefill) F.linear over them serves."""
