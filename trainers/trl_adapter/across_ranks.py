"""Figures a step logs, taken over every trainer rank: each rank computes its own share of the
step's tokens, and only rank 0 writes the log. TRL gathers its own figures across ranks the same
way before it logs them.

Each function is a collective when the trainer runs on several ranks: every rank calls it once
per forward, in the same order (as it runs the forward itself). On one process it returns its
argument.
"""

from __future__ import annotations

import torch


def _several_ranks() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def summed(values: torch.Tensor) -> torch.Tensor:
    """`values` summed element by element over the ranks (in place)."""
    if _several_ranks():
        torch.distributed.all_reduce(values)
    return values


def largest(values: torch.Tensor) -> torch.Tensor:
    """The element-wise maximum of `values` over the ranks (in place)."""
    if _several_ranks():
        torch.distributed.all_reduce(values, op=torch.distributed.ReduceOp.MAX)
    return values
