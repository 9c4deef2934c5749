"""Speculative decoding on a real model: acceptance, tokens per verification, tokens per forward.

    python benchmarks/bench_speculative.py                       # SmolLM2-135M-Instruct, CPU
    python benchmarks/bench_speculative.py --prompts 16 --group-size 8 --max-tokens 256

Runs the default GRPO task's prompts (generated arithmetic word problems, chat template) as
groups of G samples, once plainly and once with n-gram speculation, with the same seeds: the
tokens must come out identical (the run fails otherwise), so the two runs do the same work and
differ only in how many forwards it took. Reports, for the speculative run: the share of drafted
tokens accepted, tokens per verification (accepted drafts + the one sampled token), and tokens per
sequence-forward over the whole run (1.0 for plain decoding); and both runs' steps and wall time.

On a GPU in the tail a step with a handful of sequences is bound by reading the weights, so a
verification of a few drafts costs about one plain step and the tail's speed-up is about its
tokens per verification; on a CPU the drafts cost compute, so wall time shows less.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollout.process_env import set_process_env_defaults  # noqa: E402

set_process_env_defaults()


def run(model_path: str, prompts, args, speculative: str) -> dict:
    from rollout import EngineConfig, LLMEngine, SamplingParams

    config = EngineConfig(
        model=model_path,
        device=args.device,
        max_model_len=1024,
        max_num_seqs=max(64, args.prompts * args.group_size),
        speculative=speculative,
        num_speculative_tokens=args.num_speculative_tokens,
        speculative_max_seqs=args.speculative_max_seqs,
    )
    engine = LLMEngine(config)
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, n=args.group_size, seed=args.seed
    )
    start = time.perf_counter()
    results = engine.generate(prompts, params)
    wall = time.perf_counter() - start
    tokens = sum(len(r.token_ids) for r in results)
    engine_stats = engine.stats()
    stats = engine_stats.speculation
    # Sequence-forwards: each sampled row of a plain step is one; a verification is one.
    forwards = tokens - stats.emitted + stats.verifications
    return {
        "speculative": speculative,
        "tokens": tokens,
        "steps": engine_stats.steps,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "verifications": stats.verifications,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "acceptance_rate": stats.accepted / stats.drafted if stats.drafted else None,
        "tokens_per_verification": stats.emitted / stats.verifications
        if stats.verifications
        else None,
        "tokens_per_sequence_forward": tokens / forwards if forwards else None,
        "token_ids": [r.token_ids for r in results],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2", help='a model folder, or "smollm2"')
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48, help="the default task's 48")
    parser.add_argument("--temperature", type=float, default=0.7, help="the default task's 0.7")
    parser.add_argument("--num-speculative-tokens", type=int, default=4)
    parser.add_argument("--speculative-max-seqs", type=int, default=64, help="speculate always")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", default="")
    args = parser.parse_args(argv)

    from benchmarks.lib.report import commit_id
    from rollout.builtin_models import smollm2_path
    from rollout.prompts import PromptFormatter
    from trainers.task.datasets import arithmetic_dataset

    model_path = str(smollm2_path()) if args.model == "smollm2" else args.model
    from transformers import AutoTokenizer

    formatter = PromptFormatter(AutoTokenizer.from_pretrained(model_path))
    rows = arithmetic_dataset(args.prompts, seed=args.seed)
    prompts = [formatter.prompt_ids(row["prompt"]) for row in rows]
    plain = run(model_path, prompts, args, "none")
    fast = run(model_path, prompts, args, "ngram")
    if fast["token_ids"] != plain["token_ids"]:
        raise SystemExit("speculation changed the emitted tokens: this is a bug")
    for r in (plain, fast):
        r.pop("token_ids")
        print(
            f"[spec] {r['speculative']:5s}: {r['tokens']} tokens in {r['steps']} steps, "
            f"{r['wall_s']:.2f} s ({r['tokens_per_s']:.0f} tok/s)",
            flush=True,
        )
    print(
        f"[spec] acceptance {fast['acceptance_rate']:.1%} of {fast['drafted']} drafted, "
        f"{fast['tokens_per_verification']:.2f} tokens per verification "
        f"({fast['verifications']} verifications), "
        f"{fast['tokens_per_sequence_forward']:.2f} tokens per sequence-forward overall; "
        f"steps {plain['steps']} -> {fast['steps']}; same tokens as the plain run"
    )
    if args.json_out:
        report = {
            "date": datetime.date.today().isoformat(),
            "commit": commit_id(),
            "command": " ".join(sys.argv),
            "settings": vars(args),
            "runs": [plain, fast],
        }
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
