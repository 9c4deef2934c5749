"""Launch settings shared by the Triton kernels and the host code that builds their launch metadata.

No torch here: the host-only scheduling part reads it.
"""

EXTEND_BLOCK_M = 64
"""Query rows per prefill/extend program: the host splits each sequence's chunk into q-blocks."""
