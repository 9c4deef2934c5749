"""Per-step state that our attention function reads while transformers runs the model.

transformers calls the registered attention function once per layer with q/k/v only; everything
paged (which slots to write, which blocks to read) comes from the context the runner sets around
the forward.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from rollout.kernels.registry import AttentionBackend


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64, device; < 0 for padding
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32, device
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32, device
    seq_lens: torch.Tensor  # [num_seqs] int32, device
    q_block_seq: (
        torch.Tensor
    )  # [num_q_blocks] int32, device: sequence of each extend q-block (-1: pad)
    q_block_start: torch.Tensor  # [num_q_blocks] int32, device: first query row within the chunk
    query_start_loc_host: list[int] | None  # host copies for the torch twin (None in CUDA graphs)
    seq_lens_host: list[int] | None
    decode_only: bool  # one query per sequence: the split-KV decode kernel applies
    max_model_len: int  # static bound on seq_lens (decode kernel grid)


@dataclass
class ForwardContext:
    meta: AttentionMetadata
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (k_cache, v_cache)
    backend: AttentionBackend


_current: ForwardContext | None = None


@contextmanager
def forward_context(ctx: ForwardContext) -> Iterator[None]:
    global _current
    previous, _current = _current, ctx
    try:
        yield
    finally:
        _current = previous


def get_forward_context() -> ForwardContext:
    if _current is None:
        raise RuntimeError(
            "paged attention was called outside an engine step; this model's attention is owned by "
            "an LLMEngine (use a separate copy of the model for training)"
        )
    return _current
