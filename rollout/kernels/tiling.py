"""Tile sizes shared by the Triton kernels and the host code that builds their launch metadata."""

EXTEND_BLOCK_M = 64
"""Query rows per prefill/extend program: the host splits each sequence's chunk into q-blocks."""
