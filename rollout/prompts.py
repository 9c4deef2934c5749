"""Turn dataset prompts (plain text or chat messages) into token ids, and completions back."""

from __future__ import annotations


class PromptFormatter:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def prompt_ids(self, prompt) -> list[int]:
        """Chat prompts go through the chat template (with the generation prompt); text is
        tokenized as is."""
        if isinstance(prompt, str):
            return self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        ids = self.tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # some versions return a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)

    def completion(self, token_ids: list[int], prompt):
        """Decoded text; in chat form (one assistant message) when the prompt was chat."""
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        if isinstance(prompt, str):
            return text
        return [{"role": "assistant", "content": text}]
