"""Write a model folder with random weights of a known shape and a given tokenizer.

    python benchmarks/make_random_model.py --shape qwen2.5-1.5b --tokenizer TOKENIZER_DIR --out DIR

For drills and timing runs of the GRPO job where no checkpoint can be fetched (a machine without
network): every shape, memory figure and step time is real; rewards are not (the model is
noise). The vocabulary is sized to the tokenizer so every sampled id decodes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollout.process_env import set_process_env_defaults  # noqa: E402

set_process_env_defaults()


def main(argv: list[str] | None = None) -> None:
    from benchmarks.lib.workloads import SHAPES

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", required=True, choices=sorted(SHAPES))
    parser.add_argument("--tokenizer", required=True, help="a folder holding a tokenizer")
    parser.add_argument("--out", required=True)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.lib.workloads import model_config

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    config = model_config(SHAPES[args.shape])
    config.vocab_size = -(-len(tokenizer) // 64) * 64
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(config, name, getattr(tokenizer, name))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, args.dtype))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    params = sum(p.numel() for p in model.parameters())
    print(
        f"wrote {args.out}: {args.shape}, {params / 1e9:.2f}B parameters, vocab {config.vocab_size}"
    )


if __name__ == "__main__":
    main()
