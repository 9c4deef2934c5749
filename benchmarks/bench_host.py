"""Host work of a decode step without a model: schedule, build the step's inputs, pack them as the
runner does for a CUDA graph (the padded layout, written into the slot's input buffer), process
results.

    python benchmarks/bench_host.py                  # w3's shape: 256 sequences x (256 + 1024)
    python benchmarks/bench_host.py --seqs 32
    python benchmarks/bench_host.py --seqs 8 --prompt-len 2048 --verify-drafts 4
                                                     # speculative verification steps

The overlap loop hides this work behind the GPU only while it is shorter than the GPU step (w3's
is a few ms on an H200: docs/performance.md), so this is the number to watch when the scheduler or
the input building changes. Runs anywhere (no torch device work); sampled tokens are random.
With --verify-drafts K every sequence verifies K drafts a step (its last token repeated; the
random tokens reject them): a verification step runs in the sync order, so all of its host work
is time the GPU waits.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollout.engine.execution.cuda_graph import (  # noqa: E402
    default_buckets,
    graph_width,
    pad_step_inputs,
)
from rollout.engine.execution.step_slot import StepSlot  # noqa: E402
from rollout.engine.execution.streams import StepStreams  # noqa: E402
from rollout.engine.sampling_params import SamplingParams  # noqa: E402
from rollout.engine.scheduling.block_manager import BlockManager  # noqa: E402
from rollout.engine.scheduling.scheduler import Scheduler  # noqa: E402
from rollout.engine.scheduling.sequence import Sequence  # noqa: E402
from rollout.engine.scheduling.step_inputs import build_step_inputs  # noqa: E402


def measure(
    num_seqs: int,
    prompt_len: int,
    new_tokens: int,
    steps: int,
    block_size: int = 16,
    prefix_caching: bool = True,
    verify_drafts: int = 0,
):
    """Median milliseconds per decode step of (schedule, build inputs, pack them for the step's
    graph, process results), with the prefix cache on as in the engine's default."""
    import torch

    max_len = prompt_len + new_tokens + block_size
    blocks = BlockManager(num_seqs * -(-max_len // block_size), block_size)
    scheduler = Scheduler(
        blocks,
        num_seqs,
        max_num_batched_tokens=8192,
        max_model_len=max_len,
        prefix_caching=prefix_caching,
    )
    params = SamplingParams(max_tokens=new_tokens, ignore_eos=True, seed=0)
    rng = np.random.default_rng(0)
    for i in range(num_seqs):
        prompt = rng.integers(0, 1000, prompt_len).tolist()
        scheduler.add(Sequence(i, str(i), i, params, 0, 0, prompt, arrival=i))

    def process(plan) -> None:
        n = len(plan.rows)
        scheduler.process_results(plan, rng.integers(0, 1000, n), rng.random(n, np.float32))

    while scheduler.waiting or any(s.num_output_tokens == 0 for s in scheduler.running):
        process(scheduler.schedule())  # the prefills
    if verify_drafts:

        def forced_draft(seq, budget: int) -> list[int]:
            most = min(verify_drafts, seq.token_limit - len(seq.token_ids) - 1, budget - 1)
            return [seq.token_ids[-1]] * max(most, 0)

        speculation = scheduler.speculation
        speculation.draft = forced_draft  # in place of the n-gram drafts
        speculation.max_drafts, speculation.max_pause = verify_drafts, 0
        speculation.max_seqs = num_seqs
    # One of the runner's two slots, as the engine sizes it (pinned memory only on CUDA).
    cpu = torch.device("cpu")
    max_rows = num_seqs * (1 + verify_drafts)
    slot = StepSlot(StepStreams(cpu), cpu, 8192, num_seqs, -(-max_len // block_size), max_rows)
    bucket = next(b for b in default_buckets(num_seqs) if b >= num_seqs)
    times = []
    for _ in range(min(steps, new_tokens - 2)):
        t0 = time.perf_counter()
        plan = scheduler.schedule()
        t1 = time.perf_counter()
        inputs = build_step_inputs(plan, block_size, scheduler.table_rows)
        t2 = time.perf_counter()
        width = graph_width(inputs, verify_drafts + 1)
        if width is None:
            raise SystemExit("bench_host: a step the engine would run without its CUDA graph")
        slot.fill_host(pad_step_inputs(inputs, bucket, width, slot.max_blocks_per_seq))
        t3 = time.perf_counter()
        process(plan)
        times.append((t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t3))
    if verify_drafts and scheduler.speculation.stats.verifications < len(times):
        raise SystemExit(
            f"--verify-drafts: {scheduler.speculation.stats.verifications} verifications in "
            f"{len(times)} steps; every step should verify (are --new-tokens too few?)"
        )
    return [1e3 * float(np.median(column)) for column in zip(*times, strict=True)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seqs", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--no-prefix-caching", action="store_true")
    parser.add_argument("--verify-drafts", type=int, default=0, help="verify K drafts a step")
    args = parser.parse_args()
    schedule, build, pack, process = measure(
        args.seqs, args.prompt_len, args.new_tokens, args.steps, 16, not args.no_prefix_caching,
        args.verify_drafts,
    )  # fmt: skip
    kind = (
        f"verification step ({args.verify_drafts} drafts)" if args.verify_drafts else "decode step"
    )
    print(
        f"{args.seqs} sequences, median ms per {kind}: schedule {schedule:.3f}, "
        f"build inputs {build:.3f}, pack for the graph {pack:.3f}, process results "
        f"{process:.3f}, total {schedule + build + pack + process:.3f}"
    )


if __name__ == "__main__":
    main()
