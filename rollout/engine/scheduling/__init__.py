"""The engine's host-only part: which tokens run in the next step, and where their KV lives.

Plain Python and numpy, no torch (tests/unit/test_layout.py fails if any module here imports it):
scheduling decisions are bookkeeping, tested on CPU in milliseconds, and cheap enough to build
step N+1 while the device runs step N.

    sequence.py        Sequence: the host state of one sample; Completion: its result
    block_manager.py   KV blocks: free list, reference counts, copy-on-write
    scheduler.py       continuous batching under a token budget, chunked prefill, preemption
    lifecycle.py       what forking, preempting and finishing do to a sequence's blocks and queue
    queues.py          the waiting and running queues, oldest first; the block-table rows
    speculation.py     Speculation: when to try, drafts, verification chunks and what they emit
    ngram_drafts.py    draft tokens from n-grams of a request's own samples
    prefix_registry.py which blocks a sequence offers to the prefix cache, and when
    step_plan.py       StepPlan: what one step runs (chunks, sampler rows, block copies)
    plan_writer.py     a decision into the plan: the chunk, its table's growth, placeholders, forks
    step_inputs.py     StepPlan -> the flat arrays one forward needs
    sample_keys.py     the per-token key the sampler's seeded noise is hashed from
    request_checks.py  what makes a request an "error" result
    route_traces.py    record_routes: each sequence's routes by position, from the steps' rows
"""
