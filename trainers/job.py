"""The GRPO job: Ray rollout actors -> RolloutPool -> TRL trainer -> weights back; W&B; summary."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from trainers.config import JobConfig, to_dict


@dataclass
class RewardLog:
    """Mean reward of every scored group, with the weight version it was generated under."""

    groups: list[tuple[int, float, int]] = field(default_factory=list)  # (version, reward, tokens)

    def add(self, event: dict) -> None:
        group = event["group"]
        tokens = sum(len(s.token_ids) for s in group.samples)
        self.groups.append((group.weight_versions[0], float(event["rewards"].mean()), tokens))

    def mean_at(self, first: bool) -> float | None:
        if not self.groups:
            return None
        versions = [v for v, _, _ in self.groups]
        target = min(versions) if first else max(versions)
        values = [r for v, r, _ in self.groups if v == target]
        return sum(values) / len(values)


def setup_environment(config: JobConfig) -> Path:
    """Offline hub, W&B inside the run directory (offline unless asked otherwise)."""
    out = Path(config.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["WANDB_MODE"] = config.wandb.mode
    os.environ.setdefault("WANDB_PROJECT", config.wandb.project)
    os.environ["WANDB_DIR"] = str(out)
    os.environ.setdefault("WANDB_CACHE_DIR", str(out / "wandb-cache"))
    os.environ.setdefault("WANDB_SILENT", "true")
    return out


def trl_args(config: JobConfig, out: Path, on_cpu: bool) -> dict:
    """The TRL trainer arguments both modes share (the sync mode then sets its own batching)."""
    t = config.trainer
    samples = t.prompts_per_step * t.num_generations  # per optimizer step
    return dict(
        output_dir=str(out),
        max_steps=t.max_steps,
        learning_rate=t.learning_rate,
        # Samples per forward x forwards per step = the step's samples. Streaming packs rows
        # by token_budget instead; TRL reads this product for its own step bookkeeping.
        per_device_train_batch_size=max(1, samples // config.gradient_accumulation_steps),
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        num_generations=t.num_generations,
        max_completion_length=t.max_completion_length,
        temperature=t.temperature,
        logging_steps=t.logging_steps,
        report_to=[] if config.wandb.mode == "disabled" else ["wandb"],
        run_name=out.name,
        seed=config.seed,
        save_strategy="no",
        bf16=t.dtype == "bfloat16",
        gradient_checkpointing=t.gradient_checkpointing,
        use_cpu=on_cpu,
    )


def streaming_trl_args(config: JobConfig) -> dict:
    """What AsyncGRPOConfig takes on top of `trl_args`."""
    t = config.trainer
    return dict(
        max_staleness=t.max_staleness,
        weight_sync_steps=t.weight_sync_steps,
        token_budget=config.token_budget,
        dtype=t.dtype,
    )


def run_job(config: JobConfig) -> dict:
    out = setup_environment(config)
    import ray
    import torch
    from transformers import AutoTokenizer

    from rollout.actors.pool import RolloutPool
    from rollout.builtin_models import smollm2_path
    from rollout.engine.config import EngineConfig
    from rollout.engine.sampling_params import SamplingParams
    from trainers import streaming_rollouts, trl_adapter
    from trainers.datasets import load_prompt_dataset
    from trainers.placement import plan_placement, ray_sees
    from trainers.prompts import PromptFormatter
    from trainers.rewards import get_reward_functions
    from trainers.rollout_logging import attach_rollout_logging, step_time_split

    model_path = str(smollm2_path()) if config.model == "smollm2" else config.model
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    dataset = load_prompt_dataset(config.dataset.source, config.dataset.num_examples, config.seed)
    reward_funcs = get_reward_functions(list(config.rewards))
    formatter = PromptFormatter(tokenizer)
    placement = plan_placement(config.rollout, torch.cuda.device_count())
    if placement.trainer_memory_fraction is not None:
        # Sharing the GPU with an actor: beyond its share the trainer gets an out-of-memory
        # error instead of starving the actor's KV cache.
        torch.cuda.set_per_process_memory_fraction(placement.trainer_memory_fraction, 0)

    started_ray = not ray.is_initialized()
    if started_ray:
        # Joining a running cluster (`ray job submit`, ray_address): its resources are set by
        # `ray start`. Starting one here: Ray gets the actors' GPUs only, the trainer keeps cuda:0.
        joining = bool(config.ray_address or os.environ.get("RAY_ADDRESS"))
        with ray_sees(None if joining else placement.ray_gpus):
            ray.init(
                address=config.ray_address,
                ignore_reinit_error=True,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
                **({} if joining else placement.ray_init_kwargs),
            )
    pool = None
    try:
        engine = EngineConfig(
            model=model_path,
            seed=config.seed,
            **placement.engine_settings(config.rollout.engine),
        )
        print(
            f"[train_grpo] {placement.num_actors} rollout actor(s), trainer on "
            f"{placement.trainer_device}, weight sync over {placement.weight_sync_backend}"
        )
        pool = RolloutPool(
            engine,
            placement.num_actors,
            num_gpus_per_actor=placement.gpus_per_actor,
            num_cpus_per_actor=config.rollout.cpus_per_actor,
        )
        t = config.trainer
        samples = t.prompts_per_step * t.num_generations  # per optimizer step
        sampling = SamplingParams(
            max_tokens=t.max_completion_length, temperature=t.temperature, n=t.num_generations
        )
        rewards = RewardLog()
        trainer_holder: dict = {}
        probe_prompt = formatter.prompt_ids(dataset[0]["prompt"])

        def parity() -> float:
            return logprob_parity(pool, trainer_holder["trainer"].model, probe_prompt)

        transfer = streaming_rollouts.PoolWeightTransfer(
            pool, parity, placement.weight_sync_backend
        )
        args = trl_args(config, out, on_cpu=placement.trainer_device == "cpu")
        start = time.perf_counter()
        if t.mode == "streaming":
            worker = streaming_rollouts.PoolRolloutWorker(
                pool, dataset, formatter, reward_funcs, sampling,
                max_inflight_groups=t.prompts_per_step, on_group=rewards.add,
            )  # fmt: skip
            args.update(streaming_trl_args(config))
            trainer = trl_adapter.build_async_trainer(
                model_path, tokenizer, dataset, reward_funcs, worker, transfer, args
            )
        else:
            synced = {"step": 0}

            def sync(trainer) -> None:
                step = trainer.state.global_step
                if step > synced["step"]:
                    transfer.pause()
                    transfer.send_weights(trainer.model.named_parameters())
                    transfer.resume()
                    synced["step"] = step

            def sampling_for(_trainer) -> SamplingParams:
                return sampling

            rollout_func = trl_adapter.make_rollout_func(pool, formatter, sampling, sync)
            args.update(
                per_device_train_batch_size=config.sync_micro_batch,
                gradient_accumulation_steps=samples // config.sync_micro_batch,
                model_init_kwargs={"dtype": t.dtype},
            )
            trainer = trl_adapter.build_sync_trainer(
                model_path, tokenizer, dataset, reward_funcs, rollout_func, args
            )
        trainer_holder["trainer"] = trainer
        attach_rollout_logging(trainer, pool, transfer)
        try:
            trainer.train()
        except torch.OutOfMemoryError as err:
            raise RuntimeError(
                f"the trainer ran out of GPU memory with trainer.token_budget={config.token_budget} "
                f"({trainer.args.gradient_accumulation_steps} forwards per step). Lower "
                "trainer.token_budget (it must stay >= rollout.engine.max_model_len), or turn on "
                "trainer.gradient_checkpointing"
            ) from err
        elapsed = time.perf_counter() - start
        if t.mode == "sync":  # TRL scored the groups itself: read its logged rewards
            rewards.groups = [
                (i, entry["reward"], 0)
                for i, entry in enumerate(trainer.state.log_history)
                if "reward" in entry
            ]
        stats = pool.stats()
        tokens = sum(s["total_tokens"] for s in stats.values())
        summary = {
            "steps": trainer.state.global_step,
            "sequences": int(sum(s["total_sequences"] for s in stats.values())),
            "rollout_tokens": int(tokens),
            "rollout_tokens_per_s": tokens / elapsed,
            "train_seconds": elapsed,
            "reward_mean_first": rewards.mean_at(first=True),
            "reward_mean_last": rewards.mean_at(first=False),
            "weight_syncs": len(transfer.history),
            "weight_sync_backend": placement.weight_sync_backend,
            "weight_sync_seconds": [round(h["seconds"], 3) for h in transfer.history],
            "logprob_max_abs_diff": [h.get("logprob_max_abs_diff") for h in transfer.history],
            "step_time_split_s": step_time_split(trainer.state.log_history),
            "token_budget": config.token_budget,
            "gradient_accumulation_steps": trainer.args.gradient_accumulation_steps,
            "trainer_peak_memory_gib": (
                torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
            ),
            "wandb_dir": str(out / "wandb"),
            "mode": t.mode,
            "num_actors": placement.num_actors,
            "config": to_dict(config),
        }
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        if hasattr(trainer, "rollout_worker") and trainer.rollout_worker is not None:
            trainer.rollout_worker.stop()
        return summary
    finally:
        _finish_wandb()
        if pool is not None:
            pool.shutdown()
        if started_ray:
            ray.shutdown()


def _finish_wandb() -> None:
    """Close the W&B run TRL opened, so its files are complete and a next job starts its own."""
    import sys

    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()
    if wandb is not None and hasattr(wandb, "teardown"):
        wandb.teardown()  # its settings (the run directory) are cached per process otherwise


def logprob_parity(pool, model, prompt_ids: list[int], max_tokens: int = 16) -> float:
    """Worst |actor logprob - trainer logprob| over a probe completion (temperature 1)."""
    import torch

    probe = pool.probe(prompt_ids, max_tokens=max_tokens)
    tokens = probe["token_ids"]
    if not tokens:
        return 0.0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        device = next(model.parameters()).device
        ids = torch.tensor([prompt_ids + tokens], device=device)
        from trainers.tree_attention import TREE_ATTENTION_NAME

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
