"""The logprob parity check after each weight sync: a probe completion's logprobs from an actor
against the trainer's own forward over the same tokens. A large gap means the actor generates
under other weights or another attention than the trainer trains with.

With the trainer across ranks, rank 0 draws the probe and every rank runs the forward (a sharded
model's forward gathers its parameters from all ranks)."""

from __future__ import annotations

from typing import Any


def trainer_logprobs(model, prompt_ids: list[int], tokens: list[int], routes=None):
    """The trainer's logprob of each of `tokens` after `prompt_ids` (a plain causal forward;
    with the actor's recorded `routes`, routing replay's)."""
    import torch

    from trainers.trl_adapter.routing_replay import replay_kwargs
    from trainers.trl_adapter.tree_attention import TREE_ATTENTION_NAME

    was_training = model.training
    model.eval()
    with torch.no_grad():
        device = next(model.parameters()).device
        ids = torch.tensor([prompt_ids + tokens], device=device)
        implementation = model.config._attn_implementation
        if implementation == TREE_ATTENTION_NAME:  # a plain causal forward for one sequence
            model.set_attn_implementation("sdpa")
        try:
            extra = replay_kwargs(routes, ids.shape[1], device)
            logits = model(input_ids=ids, **extra).logits[0, len(prompt_ids) - 1 : -1].float()
        finally:
            if implementation == TREE_ATTENTION_NAME:
                model.set_attn_implementation(implementation)
    model.train(was_training)
    picked = torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens, device=device)[:, None])
    return picked[:, 0].cpu()


def logprob_parity(pool, model, prompt_ids: list[int], max_tokens: int = 16) -> float:
    """Worst |actor logprob - trainer logprob| over a probe completion (temperature 1)."""
    import torch

    probe = pool.probe(prompt_ids, max_tokens=max_tokens)
    if not probe["token_ids"]:
        return 0.0
    expected = trainer_logprobs(model, prompt_ids, probe["token_ids"], probe.get("routes"))
    return float((expected - torch.tensor(probe["logprobs"])).abs().max())


class ParityProbe:
    """`logprob_parity` after each sync, recorded in the weight transfer's history. The transfer
    is built before the trainer (the streaming trainer takes it as an argument), so the
    trainer's model is attached once the trainer exists. `every_actor`: probe each live actor
    and record the worst gap (colocated ranks feed one actor each)."""

    def __init__(
        self, pool, prompt_ids: list[int], max_tokens: int = 16, every_actor: bool = False
    ) -> None:
        self.pool = pool
        self.prompt_ids = prompt_ids
        self.max_tokens = max_tokens
        self.every_actor = every_actor
        self.model: Any = None

    def attach(self, model) -> None:
        self.model = model

    def run(self, accelerator=None, transfer=None) -> None:
        """After a sync: rank 0 (the one holding `transfer`) draws the probes; with an
        `accelerator` of several ranks, their tokens go to every rank, which all run the
        forwards. The gap lands in `transfer.history[-1]`."""
        import torch

        assert self.model is not None, "attach the trainer's model before the first sync"
        if accelerator is None or accelerator.num_processes == 1:
            if transfer is not None and transfer.history:
                gap = logprob_parity(self.pool, self.model, self.prompt_ids, self.max_tokens)
                transfer.history[-1]["logprob_max_abs_diff"] = gap
            return
        from accelerate.utils import broadcast_object_list

        probes = None
        if transfer is not None:
            actors = list(self.pool.live_actors()) if self.every_actor else [None]
            probes = [
                self.pool.probe(self.prompt_ids, max_tokens=self.max_tokens, actor=actor)
                for actor in actors
            ]
        probes = broadcast_object_list([probes], from_process=0)[0]
        gaps = []
        for probe in probes:
            if probe["token_ids"]:
                expected = trainer_logprobs(
                    self.model, self.prompt_ids, probe["token_ids"], probe.get("routes")
                )
                gaps.append(float((expected - torch.tensor(probe["logprobs"])).abs().max()))
        if transfer is not None and transfer.history and gaps:
            transfer.history[-1]["logprob_max_abs_diff"] = max(gaps)
