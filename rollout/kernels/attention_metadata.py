"""What one step's attention reads besides q/k/v: the paged layout of every sequence in the batch.

The engine fills it per step (`rollout.engine.model.forward_context`); the backends and kernels read it.
It lives beside the kernels so that they depend on nothing in the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] int64, device; < 0 for padding
    block_tables: torch.Tensor  # [num_seqs, max_blocks_per_seq] int32, device
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32, device
    seq_lens: torch.Tensor  # [num_seqs] int32, device
    q_block_seq: torch.Tensor  # [num_q_blocks] int32, device: each q-block's sequence (-1: pad)
    q_block_start: torch.Tensor  # [num_q_blocks] int32, device: first query row within the chunk
    query_start_loc_host: list[int] | None  # host copies for the torch twin (None in CUDA graphs)
    seq_lens_host: list[int] | None
    # Query tokens per sequence when every sequence has the same number (1 in decode, K + 1 in a
    # verification step laid out for its graph), else 0: the split-KV decode kernel applies to 1
    # and to a few.
    uniform_query_len: int
    max_model_len: int  # static bound on seq_lens (decode kernel grid)
