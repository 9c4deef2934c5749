"""Which steps replay a CUDA graph, and the padded layout they replay it with (numpy only)."""

from __future__ import annotations

import numpy as np

from rollout.engine.execution.cuda_graph import graph_width, pad_step_inputs
from rollout.engine.scheduling.step_inputs import StepInputs


def _inputs(lens: list[int], contexts: list[int], sampled: list[int]) -> StepInputs:
    """Sequence i: lens[i] new tokens ending at context contexts[i], its last sampled[i] tokens
    sampled (one row each, in order)."""
    qsl = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    positions = np.concatenate([np.arange(c - n, c) for n, c in zip(lens, contexts, strict=True)])
    logits = np.concatenate([np.arange(qsl[i + 1] - k, qsl[i + 1]) for i, k in enumerate(sampled)])
    rows = len(logits)
    return StepInputs(
        input_ids=np.arange(100, 100 + qsl[-1], dtype=np.int64),
        positions=positions.astype(np.int64),
        slot_mapping=positions.astype(np.int64) + 1000,
        carry_src=np.full(qsl[-1], -1, dtype=np.int64),
        query_start_loc=qsl,
        seq_lens=np.array(contexts, dtype=np.int32),
        block_tables=np.ones((len(lens), 2), dtype=np.int32),
        logits_indices=logits.astype(np.int64),
        row_logits=np.arange(rows, dtype=np.int64),
        temperature=np.full(rows, 0.7, dtype=np.float32),
        top_k=np.zeros(rows, dtype=np.int64),
        top_p=np.ones(rows, dtype=np.float32),
        min_p=np.zeros(rows, dtype=np.float32),
        keys=np.arange(1, rows + 1, dtype=np.int64),
        block_copies=np.zeros((0, 2), dtype=np.int64),
        q_block_seq=np.arange(len(lens), dtype=np.int32),
        q_block_start=np.zeros(len(lens), dtype=np.int32),
    )


def test_graph_width_takes_decode_and_verification_steps_only():
    assert graph_width(_inputs([1, 1], [9, 30], [1, 1]), verify_width=5) == 1
    verification = _inputs([3, 1, 5], [9, 30, 12], [3, 1, 5])
    assert graph_width(verification, verify_width=5) == 5
    assert graph_width(verification, verify_width=1) is None  # speculation off
    assert graph_width(verification, verify_width=4) is None  # a run longer than the graph's
    assert graph_width(_inputs([3, 1], [9, 4], [3, 1]), verify_width=5) is None  # context < 5
    assert graph_width(_inputs([8, 1], [8, 30], [1, 1]), verify_width=5) is None  # a prefill


def test_padded_layout_keeps_every_real_token_row_and_context():
    inputs = _inputs([3, 1, 5], [9, 30, 12], [3, 1, 5])
    padded = pad_step_inputs(inputs, bucket=4, width=5, max_blocks_per_seq=6)
    assert padded.num_tokens == padded.num_rows == 20 and padded.num_seqs == 4
    assert padded.query_start_loc.tolist() == [0, 5, 10, 15, 20]
    assert padded.seq_lens.tolist() == [9, 30, 12, 0]  # real contexts; the padded one: none
    places = [2, 3, 4, 9, 10, 11, 12, 13, 14]  # padding first in each sequence's five places
    assert padded.input_ids[places].tolist() == inputs.input_ids.tolist()
    assert padded.positions[places].tolist() == inputs.positions.tolist()
    assert padded.slot_mapping[places].tolist() == inputs.slot_mapping.tolist()
    others = np.setdiff1d(np.arange(20), places)
    assert np.all(padded.slot_mapping[others] == -1)  # padding writes no KV
    assert padded.positions[:2].tolist() == [4, 5]  # just before the first real token (6)
    # The step's own rows come first, in order, drawing from their tokens' new places.
    assert padded.row_logits[:9].tolist() == places
    assert padded.keys[:9].tolist() == inputs.keys.tolist()
    assert padded.q_block_seq.tolist() == [0, 1, 2, -1]
