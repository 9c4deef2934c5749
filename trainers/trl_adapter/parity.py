"""The logprob parity check after each weight sync: a probe completion's logprobs from an actor
against the trainer's own forward over the same tokens. A large gap means the actor generates
under other weights or another attention than the trainer trains with."""

from __future__ import annotations

from typing import Any


def logprob_parity(pool, model, prompt_ids: list[int], max_tokens: int = 16) -> float:
    """Worst |actor logprob - trainer logprob| over a probe completion (temperature 1)."""
    import torch

    from trainers.trl_adapter.tree_attention import TREE_ATTENTION_NAME

    probe = pool.probe(prompt_ids, max_tokens=max_tokens)
    tokens = probe["token_ids"]
    if not tokens:
        return 0.0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        device = next(model.parameters()).device
        ids = torch.tensor([prompt_ids + tokens], device=device)
        implementation = model.config._attn_implementation
        if implementation == TREE_ATTENTION_NAME:  # a plain causal forward for one sequence
            model.set_attn_implementation("sdpa")
        try:
            logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
        finally:
            if implementation == TREE_ATTENTION_NAME:
                model.set_attn_implementation(implementation)
    model.train(was_training)
    expected = torch.log_softmax(logits, -1).gather(
        1, torch.tensor(tokens, device=device)[:, None]
    )[:, 0]
    return float((expected.cpu() - torch.tensor(probe["logprobs"])).abs().max())


class ParityProbe:
    """`logprob_parity` for the weight transfer to call after a sync. The transfer is built
    before the trainer (the streaming trainer takes it as an argument), so the trainer's model
    is attached once the trainer exists."""

    def __init__(self, pool, prompt_ids: list[int]) -> None:
        self.pool = pool
        self.prompt_ids = prompt_ids
        self.model: Any = None

    def attach(self, model) -> None:
        self.model = model

    def __call__(self) -> float:
        assert self.model is not None, "attach the trainer's model before the first sync"
        return logprob_parity(self.pool, self.model, self.prompt_ids)
