"""CUDA graphs for decode steps: one per (padded batch size, input slot, sampler mode).

A decode step's shapes depend only on its batch size, so it is padded up to the nearest bucket
and replayed from a graph captured once. Each slot has its own graphs (they read that slot's
buffers and the other slot's sampled tokens for the carry-over); all graphs share one memory pool,
which is safe because they never run at the same time. Per-sequence values (tokens, positions,
slots, block tables, lengths, sampling parameters) live in the slot's device buffers and are
refilled in place before each replay. Padded rows write no KV (slot -1), attend to nothing
(length 0) and sample rows nobody reads, so they cannot touch real rows.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

import numpy as np
import torch

from rollout.engine.scheduling.step_inputs import StepInputs

SAMPLER_PLAIN, SAMPLER_FILTERED = "plain", "filtered"


def default_buckets(max_num_seqs: int) -> list[int]:
    sizes = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512]
    return sorted({s for s in sizes if s < max_num_seqs} | {max_num_seqs})


def graph_eligible(inputs: StepInputs) -> bool:
    """Plain decode: one token, one logits row and one sample per sequence, in order."""
    n = inputs.num_seqs
    return inputs.decode_only and len(inputs.logits_indices) == n and inputs.num_rows == n


def pad_decode_inputs(inputs: StepInputs, bucket: int, max_blocks_per_seq: int) -> StepInputs:
    """The same step padded to `bucket` rows with rows that change nothing, block tables padded
    to their static width (the graph reads a fixed [bucket, max_blocks_per_seq] view)."""
    n = inputs.num_seqs
    pad = bucket - n
    block_tables = np.zeros((bucket, max_blocks_per_seq), dtype=np.int32)
    block_tables[:n, : inputs.block_tables.shape[1]] = inputs.block_tables

    def extend(array: np.ndarray, value) -> np.ndarray:
        return np.concatenate([array, np.full(pad, value, dtype=array.dtype)])

    arange = np.arange(bucket, dtype=np.int64)
    return StepInputs(
        input_ids=extend(inputs.input_ids, 0),
        positions=extend(inputs.positions, 0),
        slot_mapping=extend(inputs.slot_mapping, -1),
        carry_src=extend(inputs.carry_src, -1),
        query_start_loc=np.arange(bucket + 1, dtype=np.int32),
        seq_lens=extend(inputs.seq_lens, 0),
        block_tables=block_tables,
        logits_indices=arange,
        row_logits=arange,
        temperature=extend(inputs.temperature, 0.0),
        top_k=extend(inputs.top_k, 0),
        top_p=extend(inputs.top_p, 1.0),
        min_p=extend(inputs.min_p, 0.0),
        keys=extend(inputs.keys, 0),
        block_copies=inputs.block_copies,
        q_block_seq=extend(inputs.q_block_seq, -1),
        q_block_start=extend(inputs.q_block_start, 0),
    )


class CaptureError(RuntimeError):
    """A decode step could not be captured; the message says which setting to change."""


class DecodeGraphs:
    """Captured decode steps, keyed by (slot index, bucket, sampler mode); captured lazily."""

    def __init__(self, buckets: list[int], capture_stream: torch.cuda.Stream) -> None:
        self.buckets = buckets
        self.stream = capture_stream
        self.pool = torch.cuda.graph_pool_handle()
        self._graphs: dict[tuple[int, int, str], torch.cuda.CUDAGraph] = {}

    def bucket_for(self, num_seqs: int) -> int | None:
        i = bisect.bisect_left(self.buckets, num_seqs)
        return self.buckets[i] if i < len(self.buckets) else None

    def get(self, key: tuple[int, int, str], body: Callable[[], None]) -> torch.cuda.CUDAGraph:
        """The graph for `key`, capturing `body` (which runs one padded step) on first use."""
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._capture(body)
            self._graphs[key] = graph
        return graph

    def _capture(self, body: Callable[[], None]) -> torch.cuda.CUDAGraph:
        # Capturing needs an idle stream: let everything queued so far finish (a one-time cost).
        torch.cuda.synchronize()
        with torch.cuda.stream(self.stream):
            body()  # warm-up: compiles kernels, creates library handles outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
                body()
        except RuntimeError as err:
            raise CaptureError(
                f"this model's decode step cannot be captured in a CUDA graph ({err}): its "
                "forward does host work, e.g. an MoE implementation that reads the routing on the "
                "host. Set cuda_graphs=False"
            ) from err
        torch.cuda.synchronize()
        return graph

    def __len__(self) -> int:
        return len(self._graphs)
