"""Sync mode (`trainer.mode=sync`): trl.GRPOTrainer, whose `rollout_func` asks the RolloutPool
for each step's groups; generation and training alternate.

`trainer_for_job` wires it: the `rollout_func` (prompts -> groups on the pool -> completions and
their logprobs; TRL scores them itself), and before each generation that follows an optimizer
step a weight sync through the pool's weight transfer (`weight_sync.py`).

Across ranks (FSDP2) every rank calls `rollout_func` with its share of the step's prompts, and a
group may straddle two ranks: rank 0 gathers every rank's prompts (in rank order they are the
sampler's order, each prompt repeated num_generations times), generates the groups on the pool
and hands each rank the completions of its own prompts. Every rank takes part in the weight
sync before it (`sharded.send_to_pool`).
"""

from __future__ import annotations

import dataclasses
import json
from functools import cache
from typing import TYPE_CHECKING, Any

from rollout.engine.sampling_params import SamplingParams
from rollout.prompts import PromptFormatter
from trainers.trl_adapter.args import trl_args, trl_config
from trainers.trl_adapter.lora import peft_config_for
from trainers.trl_adapter.off_policy import RecordsMismatch, weighted_advantages
from trainers.trl_adapter.planned_lengths import planned_lengths
from trainers.trl_adapter.replay_batches import WithRoutes
from trainers.trl_adapter.sharded import ShardedOnCpuRanks, fsdp_args, send_to_pool

if TYPE_CHECKING:
    from trainers.job.config import JobConfig
    from trainers.trl_adapter.builder import JobInputs


def trainer_for_job(job: JobInputs, sampling: SamplingParams, transfer, probe=None, feed=None):
    """The job's trl.GRPOTrainer, generating through the pool (`probe`: the parity check after
    each sync; `feed`: colocated ranks, each sending to its own actor)."""
    config = job.config
    before_generation = WeightsBeforeGeneration(
        transfer, probe, lora=config.trainer.lora is not None, feed=feed
    )
    rollout_func = make_rollout_func(
        job.pool,
        job.formatter,
        sampling,
        before_generation,
        environment=config.environment.name,
        rows=job.dataset if config.environment.name else None,
        episode_limits=config.episode_limits(),
        planned=planned_lengths(config.rollout.planned_lengths),
    )
    args = trl_args(config, job.out, job.on_cpu) | sync_trl_args(config)
    if job.num_processes > 1:
        args |= fsdp_args()
    return build_sync_trainer(
        job.model_path,
        job.tokenizer,
        job.dataset,
        job.reward_funcs,
        rollout_func,
        args,
        peft_config=peft_config_for(config.trainer.lora) if config.trainer.lora else None,
    )


def sync_trl_args(config: JobConfig) -> dict:
    """What GRPOConfig takes on top of `trl_args`: trl.GRPOTrainer pads each forward to its
    longest sample, so each rank's share of a step's samples goes in `sync_micro_batch`-sized
    forwards; it scores the groups itself, so it gets the reward weights."""
    t = config.trainer
    args = dict(
        per_device_train_batch_size=config.sync_micro_batch,
        gradient_accumulation_steps=config.samples_per_rank // config.sync_micro_batch,
        model_init_kwargs={"dtype": t.dtype},
    )
    if config.reward_weights is not None:
        args["reward_weights"] = list(config.reward_weights)
    return args


def build_sync_trainer(
    model_path: str, tokenizer, dataset, reward_funcs, rollout_func, args: dict, peft_config=None
):
    from trl import GRPOConfig

    return sync_trainer_class()(
        model=model_path,
        reward_funcs=reward_funcs,
        args=trl_config(GRPOConfig, args),
        train_dataset=dataset,
        processing_class=tokenizer,
        rollout_func=rollout_func,
        peft_config=peft_config,
    )


@cache
def sync_trainer_class():
    from trl import GRPOTrainer

    class PoolGRPOTrainer(ShardedOnCpuRanks, RecordsMismatch, GRPOTrainer):
        """trl.GRPOTrainer whose CPU ranks shard like GPU ranks (`sharded.ShardedOnCpuRanks`),
        with the off-policy correction against the rollout's logprobs (`off_policy.py`)."""

        sample_routes = None  # replay_batches.RoutesByTokens, with routing replay

        def _compute_loss(self, model, inputs):
            mode, cap = self.off_policy
            if self.route_replay is not None:
                model = WithRoutes(model, self.sample_routes.padded(inputs))
            loss = weighted_advantages(
                self, super()._compute_loss, model, inputs, mode, cap, self.record_mismatch
            )
            self.record_routing()
            return loss

    return PoolGRPOTrainer


class WeightsBeforeGeneration:
    """Sends the trainer's weights (with LoRA: its adapter) to the pool when the trainer has
    stepped since the last send, so every generation runs under the weights the trainer
    holds; then the parity probe. Every rank calls it (rank 0 holds the transfer)."""

    def __init__(self, transfer, probe=None, lora: bool = False, feed=None) -> None:
        self.transfer = transfer
        self.probe = probe
        self.lora = lora
        self.feed = feed
        self.synced_step = 0

    def __call__(self, trainer) -> None:
        step = trainer.state.global_step
        if step > self.synced_step:
            accelerator = trainer.accelerator
            model = accelerator.unwrap_model(trainer.model)
            transfer = self.transfer if accelerator.is_main_process else None
            send_to_pool(accelerator, model, transfer, self.lora, self.probe, self.feed)
            self.synced_step = step


def make_rollout_func(
    pool,
    formatter: PromptFormatter,
    sampling: SamplingParams,
    before_generation: WeightsBeforeGeneration,
    environment: str | None = None,
    rows=None,
    episode_limits=None,
    planned=None,
):
    """`rollout_func` for trl.GRPOTrainer: prompts arrive repeated num_generations times in a row;
    each run of equal prompts becomes one group on the pool; one completion per received prompt.
    With an `environment`, each group is that many episodes on the prompt's dataset row (found
    in `rows` by its prompt); TRL gets `env_mask` (the model's tokens) and `env_reward` (read by
    the `environment` reward)."""
    row_of = {_key(r["prompt"]): r for r in rows} if rows is not None else {}

    def generate(prompts: list, num_generations: int) -> dict[str, list]:
        groups = []
        for start in range(0, len(prompts), num_generations):
            prompt = prompts[start]
            if any(p != prompt for p in prompts[start : start + num_generations]):
                raise RuntimeError(  # TRL's sampler repeats each prompt num_generations times
                    "trl.GRPOTrainer handed the rollout prompts that are not runs of "
                    f"{num_generations} equal prompts; this trainer version is not supported"
                )
            params = dataclasses.replace(sampling, n=num_generations)
            if planned is not None:  # benchmark mode: each sample's length drawn in advance
                params = planned.params_for(params)
            if environment is None:
                groups.append(pool.submit(formatter.prompt_ids(prompt), params))
            else:
                row = dict(row_of[_key(prompt)])
                groups.append(
                    pool.submit([], params, environment=environment, row=row, limits=episode_limits)
                )
        done = {}
        while len(done) < len(groups):
            group = pool.get(timeout=3600)
            done[group.group_id] = group
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        if environment is not None:
            out |= {"env_mask": [], "env_reward": []}
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
                if sample.routes is not None:  # recorded for routing replay
                    out.setdefault("routes", []).append(sample.routes)
                if environment is not None:
                    out["env_mask"].append(sample.completion_mask)
                    out["env_reward"].append(sample.reward)
        return out

    def rollout_func(prompts: list, trainer: Any) -> dict[str, list]:
        before_generation(trainer)  # the pool generates with the trainer's current weights
        num_generations = trainer.args.num_generations
        accelerator = trainer.accelerator
        if accelerator.num_processes == 1:
            return keep_routes(generate(prompts, num_generations), trainer)
        mine = _generated_on_rank_zero(
            accelerator, prompts, lambda everyone: generate(everyone, num_generations)
        )
        return keep_routes(mine, trainer)

    return rollout_func


def _generated_on_rank_zero(accelerator, prompts: list, generate) -> dict[str, list]:
    """Every rank's prompts generated in one call on rank 0 (the pool's driver), and this rank's
    rows of the result. A failure there ends every rank with rank 0's error."""
    from accelerate.utils import broadcast_object_list, gather_object

    counts = gather_object([len(prompts)])
    everyone = gather_object(list(prompts))  # rank order: the sampler's order
    out, failure = None, None
    if accelerator.is_main_process:
        try:
            out = generate(everyone)
        except Exception as err:  # every rank ends with rank 0's error, none waits on it
            failure, out = err, {"error": f"{type(err).__name__}: {err}"}
    out = broadcast_object_list([out], from_process=0)[0]
    if failure is not None:
        raise failure
    if "error" in out:
        raise RuntimeError(f"rank 0's rollout failed: {out['error']}")
    start = sum(counts[: accelerator.process_index])
    return {key: rows[start : start + len(prompts)] for key, rows in out.items()}


def keep_routes(out: dict, trainer) -> dict:
    """The samples' routes go to the trainer's RoutesByTokens (routing replay), not to TRL."""
    routes = out.pop("routes", None)
    if routes is not None and getattr(trainer, "sample_routes", None) is not None:
        trainer.sample_routes.replace(out["prompt_ids"], out["completion_ids"], routes)
    return out


def _key(prompt) -> str:
    return json.dumps(prompt, sort_keys=True)
