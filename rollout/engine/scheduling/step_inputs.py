"""Turn a StepPlan into the flat host arrays one forward needs. numpy only, no torch."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

import numpy as np

from rollout.engine.scheduling.sample_keys import token_keys
from rollout.engine.scheduling.sequence import PLACEHOLDER
from rollout.engine.scheduling.step_plan import StepPlan
from rollout.kernels.tiling import EXTEND_BLOCK_M


@dataclass
class StepInputs:
    input_ids: np.ndarray  # [num_tokens] int64; 0 where a placeholder waits for carry-over
    positions: np.ndarray  # [num_tokens] int64
    slot_mapping: np.ndarray  # [num_tokens] int64
    carry_src: np.ndarray  # [num_tokens] int64; row of the previous step's samples, or -1
    query_start_loc: np.ndarray  # [num_seqs + 1] int32
    seq_lens: np.ndarray  # [num_seqs] int32: context length after this step
    block_tables: np.ndarray  # [num_seqs, max_blocks] int32 (padded with 0)
    logits_indices: np.ndarray  # [num_logits] int64: token rows whose logits are needed
    row_logits: np.ndarray  # [num_rows] int64: which logits row each sample draws from
    temperature: np.ndarray  # [num_rows] float32
    top_k: np.ndarray  # [num_rows] int64
    top_p: np.ndarray  # [num_rows] float32
    min_p: np.ndarray  # [num_rows] float32
    keys: np.ndarray  # [num_rows] int64
    block_copies: np.ndarray  # [num_copies, 2] int64 (src, dst)
    q_block_seq: np.ndarray  # [num_q_blocks] int32: the chunk each extend-kernel q-block belongs to
    q_block_start: np.ndarray  # [num_q_blocks] int32: its first query row within the chunk

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def num_rows(self) -> int:
        return len(self.row_logits)

    @property
    def decode_only(self) -> bool:
        return self.num_tokens == self.num_seqs

    @property
    def uniform_query_len(self) -> int:
        """Tokens per sequence when every sequence has the same number, else 0."""
        if self.decode_only:
            return 1
        lens = np.diff(self.query_start_loc)
        return int(lens[0]) if len(lens) and lens.min() == lens.max() else 0

    @property
    def needs_sort(self) -> bool:
        return bool(np.any(self.top_k > 0) or np.any(self.top_p < 1))

    @property
    def needs_min_p(self) -> bool:
        return bool(np.any(self.min_p > 0))


def build_step_inputs(
    plan: StepPlan, block_size: int, table_rows: np.ndarray | None = None
) -> StepInputs:
    """`table_rows`: the scheduler's block-table mirror (gathered in one op); without it the
    tables are copied from each sequence's list (the simple path, used by unit tests)."""
    chunks = plan.chunks
    num_seqs = len(chunks)
    lens = np.fromiter((len(c.token_ids) for c in chunks), dtype=np.int64, count=num_seqs)
    starts = np.fromiter((c.start for c in chunks), dtype=np.int64, count=num_seqs)
    query_start_loc = np.zeros(num_seqs + 1, dtype=np.int32)
    np.cumsum(lens, out=query_start_loc[1:])
    seq_lens = (starts + lens).astype(np.int32)

    input_ids = np.fromiter(
        chain.from_iterable(c.token_ids for c in chunks), dtype=np.int64, count=plan.num_tokens
    )
    # Token i of chunk s sits at position starts[s] + (i - query_start_loc[s]).
    owner = np.repeat(np.arange(num_seqs), lens)
    positions = np.arange(plan.num_tokens, dtype=np.int64) - query_start_loc[owner] + starts[owner]

    max_blocks = max(len(c.seq.block_table) for c in chunks)
    if table_rows is not None:
        block_tables = table_rows[[c.seq.table_row for c in chunks], :max_blocks]
    else:
        block_tables = np.zeros((num_seqs, max_blocks), dtype=np.int32)
        for s, c in enumerate(chunks):
            block_tables[s, : len(c.seq.block_table)] = c.seq.block_table
    slot_mapping = (
        block_tables[owner, positions // block_size].astype(np.int64) * block_size
        + positions % block_size
    )

    carry_src = np.full(plan.num_tokens, -1, dtype=np.int64)
    last_token = query_start_loc[1:].astype(np.int64) - 1
    carry_rows = np.fromiter((c.carry_row for c in chunks), dtype=np.int64, count=num_seqs)
    carried = carry_rows >= 0
    carry_src[last_token[carried]] = carry_rows[carried]
    assert np.all(input_ids[carry_src < 0] != PLACEHOLDER), (
        "placeholder without a carry-over source"
    )
    input_ids[carry_src >= 0] = 0  # filled on the device

    logits_indices, logits_row_of_chunk = _logit_positions(plan, last_token)
    q_block_seq, q_block_start = _extend_query_blocks(lens)

    rows = plan.rows
    num_rows = len(rows)
    row_logits = logits_row_of_chunk[[r.chunk_index for r in rows]].astype(np.int64)
    if plan.speculative:
        row_logits += np.fromiter((max(r.draft_index, 0) for r in rows), np.int64, count=num_rows)
    params = [r.seq.params for r in rows]
    temperature, top_k, top_p, min_p = _sampling_arrays(params)
    held_keys = np.fromiter((r.seq.sample_key for r in rows), dtype=np.uint64, count=num_rows)
    out_pos = np.fromiter(
        (r.position - len(r.seq.prompt_token_ids) for r in rows), dtype=np.uint64, count=num_rows
    )
    return StepInputs(
        input_ids=input_ids,
        positions=positions,
        slot_mapping=slot_mapping,
        carry_src=carry_src,
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        block_tables=block_tables,
        logits_indices=logits_indices.astype(np.int64),
        row_logits=row_logits,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        keys=token_keys(held_keys, out_pos),
        block_copies=np.array(plan.block_copies, dtype=np.int64).reshape(-1, 2),
        q_block_seq=q_block_seq,
        q_block_start=q_block_start,
    )


def _logit_positions(plan: StepPlan, last_token: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the token positions whose logits the step keeps, in order; each chunk's first row of
    them, -1 for a chunk that samples nothing). A sampling chunk keeps its last position's, a
    verification its last num_drafts + 1, in order."""
    chunks = plan.chunks
    sampling_chunks = [s for s, c in enumerate(chunks) if c.num_samples > 0]
    logits_row_of_chunk = np.full(len(chunks), -1, dtype=np.int64)
    if not plan.speculative:
        logits_row_of_chunk[sampling_chunks] = np.arange(len(sampling_chunks))
        return last_token[sampling_chunks], logits_row_of_chunk
    per_chunk = np.array([chunks[s].num_drafts + 1 for s in sampling_chunks], dtype=np.int64)
    first = np.cumsum(per_chunk) - per_chunk
    logits_row_of_chunk[sampling_chunks] = first
    owner_of_logit = np.repeat(np.arange(len(sampling_chunks)), per_chunk)
    back = first[owner_of_logit] + per_chunk[owner_of_logit] - 1 - np.arange(len(owner_of_logit))
    return last_token[sampling_chunks][owner_of_logit] - back, logits_row_of_chunk


def _extend_query_blocks(lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The extend kernel's query blocks of EXTEND_BLOCK_M tokens: each one's chunk, and its first
    token's offset in that chunk."""
    q_blocks = -(-lens // EXTEND_BLOCK_M)
    q_block_seq = np.repeat(np.arange(len(lens), dtype=np.int32), q_blocks)
    first_block = np.cumsum(q_blocks) - q_blocks
    q_block_start = (np.arange(len(q_block_seq)) - first_block[q_block_seq]) * EXTEND_BLOCK_M
    return q_block_seq, q_block_start.astype(np.int32)


def _sampling_arrays(params: list) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-row temperature, top-k, top-p and min-p. A rollout batch usually shares one
    SamplingParams object: then each array is one fill instead of a pass over the rows."""
    n = len(params)
    if n and all(p is params[0] for p in params):
        p = params[0]
        return (
            np.full(n, p.temperature, dtype=np.float32),
            np.full(n, p.top_k, dtype=np.int64),
            np.full(n, p.top_p, dtype=np.float32),
            np.full(n, p.min_p, dtype=np.float32),
        )
    return (
        np.array([p.temperature for p in params], dtype=np.float32),
        np.array([p.top_k for p in params], dtype=np.int64),
        np.array([p.top_p for p in params], dtype=np.float32),
        np.array([p.min_p for p in params], dtype=np.float32),
    )
