"""CUDA graphs for decode and verification steps: one per (input slot, padded batch size,
sampler mode, tokens per sequence).

A decode step's shapes depend only on its batch size, so it is padded up to the nearest bucket
and replayed from a graph captured once. A speculative verification step (each sequence's last
token and its drafts, every one of them sampled) is padded the same way and, in addition, to the
same number of tokens per sequence (`verify_width`: the most a verification holds), so that it
replays a graph too instead of paying an eager forward's launch cost per kernel (about ten plain
decode steps for an 8B model: docs/performance.md). Each slot has its own graphs (they read that
slot's buffers and the other slot's sampled tokens for the carry-over); all graphs share one
memory pool, which is safe because they never run at the same time. Per-sequence values (tokens,
positions, slots, block tables, lengths, sampling parameters) live in the slot's device buffers
and are refilled in place before each replay. Padding changes nothing real: padded tokens write
no KV (slot -1), padded sequences attend to nothing (length 0, no query block), and padded rows
are sampled into rows past the step's own, which nobody reads.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

import numpy as np
import torch

from rollout.engine.scheduling.step_inputs import StepInputs
from rollout.kernels.tiling import EXTEND_BLOCK_M

SAMPLER_PLAIN, SAMPLER_FILTERED = "plain", "filtered"


def default_buckets(max_num_seqs: int) -> list[int]:
    sizes = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 448, 512]
    return sorted({s for s in sizes if s < max_num_seqs} | {max_num_seqs})


def graph_width(inputs: StepInputs, verify_width: int) -> int | None:
    """Tokens per sequence of the graph that can run this step, or None (it runs eagerly).

    1 for plain decode (one token, one logits row and one sample per sequence, in order).
    `verify_width` (0 or 1: none) for a step in which every token is sampled once, in order,
    and no sequence has more than verify_width tokens: a verification step, its drafting
    sequences beside plain decode rows. Such a step also needs every context to be at least
    verify_width tokens long, so that the padding placed before a sequence's tokens sits at
    real positions (a padded query then attends to something and stays finite)."""
    n, num_tokens = inputs.num_seqs, inputs.num_tokens
    if inputs.decode_only:
        return 1 if len(inputs.logits_indices) == n and inputs.num_rows == n else None
    if verify_width <= 1 or inputs.num_rows != num_tokens:
        return None
    every_token = np.arange(num_tokens)
    if not (
        np.array_equal(inputs.logits_indices, every_token)
        and np.array_equal(inputs.row_logits, every_token)
    ):
        return None
    lens = np.diff(inputs.query_start_loc)
    if lens.max() > verify_width or inputs.seq_lens.min() < verify_width:
        return None
    return verify_width


def pad_step_inputs(
    inputs: StepInputs, bucket: int, width: int, max_blocks_per_seq: int
) -> StepInputs:
    """The step laid out for its graph: `bucket` sequences of `width` tokens each, block tables
    at their static width. Sequence i's tokens take the last places of its `width` ones (the
    padding comes first, so the query length is `width` while the context length stays the real
    one and no query reads past it); sampler rows: the step's own first, in their order."""
    n = inputs.num_seqs
    total = bucket * width
    if width == 1:  # decode (every step but verifications): token i stays at place i
        dest = np.arange(n)
        positions = np.zeros(total, dtype=np.int64)
        positions[:n] = inputs.positions
    else:
        lens = np.diff(inputs.query_start_loc).astype(np.int64)
        owner = np.repeat(np.arange(n), lens)
        within = np.arange(inputs.num_tokens) - inputs.query_start_loc[owner]
        dest = owner * width + (width - lens[owner]) + within  # each real token's place
        # A padded token's position: the one just before its sequence's first real token,
        # counting back (a valid rotary index; its output is never read).
        first = np.zeros(bucket, dtype=np.int64)
        first[:n] = inputs.positions[inputs.query_start_loc[:-1]]
        lead = np.zeros(bucket, dtype=np.int64)
        lead[:n] = width - lens
        offset = np.tile(np.arange(width, dtype=np.int64), bucket)
        positions = np.maximum(np.repeat(first - lead, width) + offset, 0)
        positions[dest] = inputs.positions

    def tokens(array: np.ndarray, fill) -> np.ndarray:
        out = np.full(total, fill, dtype=array.dtype)
        out[dest] = array
        return out

    block_tables = np.zeros((bucket, max_blocks_per_seq), dtype=np.int32)
    block_tables[:n, : inputs.block_tables.shape[1]] = inputs.block_tables
    seq_lens = np.zeros(bucket, dtype=np.int32)
    seq_lens[:n] = inputs.seq_lens
    q_blocks = -(-width // EXTEND_BLOCK_M)
    q_block_seq = np.repeat(np.arange(bucket, dtype=np.int32), q_blocks)
    q_block_seq[q_block_seq >= n] = -1  # padded sequences: no query block
    q_block_start = np.tile(np.arange(q_blocks, dtype=np.int32) * EXTEND_BLOCK_M, bucket)

    def rows(array: np.ndarray, fill) -> np.ndarray:
        return np.concatenate([array, np.full(total - len(array), fill, dtype=array.dtype)])

    row_logits = rows(dest[inputs.logits_indices[inputs.row_logits]], 0)
    return StepInputs(
        input_ids=tokens(inputs.input_ids, 0),
        positions=positions,
        slot_mapping=tokens(inputs.slot_mapping, -1),
        carry_src=tokens(inputs.carry_src, -1),
        query_start_loc=np.arange(0, total + 1, width, dtype=np.int32),
        seq_lens=seq_lens,
        block_tables=block_tables,
        logits_indices=np.arange(total, dtype=np.int64),
        row_logits=row_logits.astype(np.int64),
        temperature=rows(inputs.temperature, 0.0),
        top_k=rows(inputs.top_k, 0),
        top_p=rows(inputs.top_p, 1.0),
        min_p=rows(inputs.min_p, 0.0),
        keys=rows(inputs.keys, 0),
        block_copies=inputs.block_copies,
        q_block_seq=q_block_seq,
        q_block_start=q_block_start,
    )


class CaptureError(RuntimeError):
    """A decode step could not be captured; the message says which setting to change."""


class DecodeGraphs:
    """Captured steps, keyed by (slot index, bucket, sampler mode, tokens per sequence);
    captured lazily."""

    def __init__(self, buckets: list[int], capture_stream: torch.cuda.Stream) -> None:
        self.buckets = buckets
        self.stream = capture_stream
        self.pool = torch.cuda.graph_pool_handle()
        self._graphs: dict[tuple[int, int, str], torch.cuda.CUDAGraph] = {}

    def bucket_for(self, num_seqs: int) -> int | None:
        i = bisect.bisect_left(self.buckets, num_seqs)
        return self.buckets[i] if i < len(self.buckets) else None

    def get(self, key: tuple[int, int, str, int], body: Callable[[], None]) -> torch.cuda.CUDAGraph:
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

    def widths(self) -> set[int]:
        """The tokens per sequence of the graphs captured (1: decode; more: verifications)."""
        return {key[3] for key in self._graphs}
