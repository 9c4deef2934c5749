"""The RolloutPool behind trl.GRPOTrainer (`trainer.mode=sync`): its `rollout_func`, and a
weight sync before each generation that follows an optimizer step."""

from __future__ import annotations

import dataclasses
from typing import Any

from rollout.engine.sampling_params import SamplingParams
from rollout.prompts import PromptFormatter


class WeightsBeforeGeneration:
    """Sends the trainer's weights to the pool when the trainer has stepped since the last
    send, so every generation runs under the weights the trainer holds."""

    def __init__(self, transfer) -> None:
        self.transfer = transfer
        self.synced_step = 0

    def __call__(self, trainer) -> None:
        step = trainer.state.global_step
        if step > self.synced_step:
            self.transfer.pause()
            self.transfer.send_weights(trainer.model.named_parameters())
            self.transfer.resume()
            self.synced_step = step


def make_rollout_func(
    pool,
    formatter: PromptFormatter,
    sampling: SamplingParams,
    before_generation: WeightsBeforeGeneration,
):
    """`rollout_func` for trl.GRPOTrainer: prompts arrive repeated num_generations times in a row;
    each run of equal prompts becomes one group on the pool; one completion per received prompt."""

    def rollout_func(prompts: list, trainer: Any) -> dict[str, list]:
        before_generation(trainer)  # the pool generates with the trainer's current weights
        num_generations = trainer.args.num_generations
        groups = []
        for start in range(0, len(prompts), num_generations):
            prompt = prompts[start]
            params = dataclasses.replace(sampling, n=num_generations)
            groups.append(pool.submit(formatter.prompt_ids(prompt), params))
        done = {}
        while len(done) < len(groups):
            group = pool.get(timeout=3600)
            done[group.group_id] = group
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for group_id in groups:
            failed = [s for s in done[group_id].samples if s.finish_reason == "error"]
            if failed:
                # trl.GRPOTrainer needs one completion per prompt: an error sample cannot be
                # left out, and must never be trained on as an empty row.
                raise RuntimeError(
                    f"a rollout sample ended in an error: {failed[0].error}. trainer.mode=sync "
                    "cannot leave it out; trainer.mode=streaming drops such samples"
                )
            for sample in done[group_id].samples:
                out["prompt_ids"].append(sample.prompt_token_ids)
                out["completion_ids"].append(sample.token_ids)
                out["logprobs"].append(sample.logprobs)
        return out

    return rollout_func
