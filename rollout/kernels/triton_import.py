"""Triton where it is installed, else a stand-in that lets the kernel modules load.

The kernels run on CUDA; a CPU machine runs their PyTorch twins, and the CPU build of torch does
not bring Triton. The kernel modules also define the custom ops the twins run behind (the FP8
roundings, the q/k norms and rotary, the MoE routing), which every engine imports, so they must
load without Triton. Without it, `triton.jit` keeps the function and refuses to launch it, and
`tl.constexpr` keeps its value: all a kernel module touches at import. Anything else (a launch,
a Triton attribute in a launch's host code) raises an error that says to install Triton.
"""

from __future__ import annotations

import functools
from typing import Any

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False

_NOT_INSTALLED = (
    "{what} needs Triton, which is not installed: `pip install triton` (a CUDA build of torch "
    "brings it), or run on the CPU, where the engine computes the kernels' PyTorch twins"
)


class _KernelWithoutTriton:
    """A `@triton.jit` function where Triton is missing: kept, never launched."""

    def __init__(self, fn):
        self.fn = fn
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid):
        raise RuntimeError(_NOT_INSTALLED.format(what=f"the kernel {self.fn.__name__}"))

    def __call__(self, *args, **kwargs):
        raise RuntimeError(_NOT_INSTALLED.format(what=f"the kernel {self.fn.__name__}"))


class _ModuleWithoutTriton:
    """`triton` or `triton.language` where Triton is missing: only what a kernel module uses at
    import."""

    def __init__(self, name: str, **members: Any):
        self._name = name
        vars(self).update(members)

    def __getattr__(self, attr: str):
        raise RuntimeError(_NOT_INSTALLED.format(what=f"{self._name}.{attr}"))


def _jit(fn=None, **options):
    # @triton.jit and @triton.jit(...)
    return _KernelWithoutTriton(fn) if fn is not None else _jit


if not HAS_TRITON:
    triton = _ModuleWithoutTriton(
        "triton",
        jit=_jit,
        cdiv=lambda a, b: -(-a // b),
        next_power_of_2=lambda n: 1 if n <= 1 else 1 << (int(n) - 1).bit_length(),
    )
    tl = _ModuleWithoutTriton("triton.language", constexpr=lambda value: value)

__all__ = ["HAS_TRITON", "tl", "triton"]
