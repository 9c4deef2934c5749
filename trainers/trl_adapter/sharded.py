"""The trainer across ranks (FSDP2 through accelerate) and its weights to the pool, for both
modes' TRL trainers.

`fsdp_args` are the TrainingArguments that turn FSDP2 on for a multi-rank run.
`ShardedOnCpuRanks` fixes accelerate's CPU ranks: it runs them as plain DDP (it has no FSDP
branch for CPU), so the CPU ranks of a sharded run are switched to FSDP2 after the accelerator
is made, and a CPU run shards, gathers and saves as a GPU run does.

`send_to_pool` is one weight sync from whatever the trainer holds: every rank gathers what rank 0
sends (each full tensor is a collective all ranks run in the same order), a whole bucket before
its transfer starts (TRL's own sync interleaves the two and hangs, trl#7103); with LoRA only the
adapter is gathered and sent (the actors merge it into their base weights); then the parity
probe, whose forward every rank joins. `pool_trainer_class` (streaming) and `sync.py` (sync
mode) both sync through it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import cache

from trainers.trl_adapter.lora import adapter_for_sync
from trainers.trl_adapter.off_policy import CorrectedForward, RecordsMismatch
from trainers.trl_adapter.replay_batches import routed_planner_class, routes_collator_class
from trainers.trl_adapter.routing_replay import ROUTES_KWARG


def fsdp_args() -> dict:
    """FSDP2 over every rank: parameters, gradients and optimizer states sharded, one unit per
    decoder layer (the model's own no-split modules); checkpoints sharded (each rank writes its
    part); the final model is gathered whole by the job."""
    config = {
        "fsdp_version": 2,
        "reshard_after_forward": True,
        "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        "state_dict_type": "SHARDED_STATE_DICT",
    }
    return {"fsdp": True, "fsdp_config": config}


class ShardedOnCpuRanks:
    """Mixin for a TRL trainer: CPU ranks of a run with `fsdp_args` shard with FSDP2 too."""

    def create_accelerator_and_postprocess(self):
        from accelerate.state import PartialState
        from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

        super().create_accelerator_and_postprocess()
        state = self.accelerator.state
        plugin_args = self.args.fsdp_plugin_args
        if state.distributed_type == DistributedType.MULTI_CPU and plugin_args:
            state.distributed_type = DistributedType.FSDP
            # Where accelerate itself keeps it for a GPU FSDP run: a later AcceleratorState()
            # (trl.GRPOTrainer makes some before it prepares the model) copies it from there.
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP
            state.fsdp_plugin = FullyShardedDataParallelPlugin(**plugin_args)
            self.is_fsdp_enabled = True


def full_parameters(model, device) -> Iterator[tuple[str, object]]:
    """(name, full tensor on `device`) of every parameter the actors hold, one at a time: a
    sharded parameter is gathered (a collective) when the iterator reaches it and freed when it
    moves on, so the whole model is never gathered at once."""
    from torch.distributed.tensor import DTensor
    from trl.experimental.async_grpo.async_grpo_trainer import _iter_vllm_named_params

    for name, param in _iter_vllm_named_params(model):
        full = param.full_tensor() if isinstance(param, DTensor) else param.detach()
        yield name, full.to(device) if full.device != device else full


class NonFiniteWeightsError(RuntimeError):
    """The trainer's weights hold NaN or infinity: the sync was refused before anything moved."""


def refuse_non_finite(accelerator, model) -> None:
    """Every rank together, before a sync touches the actors: if any rank's parameters (its own
    shards) hold NaN or infinity, every rank raises NonFiniteWeightsError and nothing is sent, so
    the actors keep serving the last weights they received whole (a receiver cannot undo buckets
    it already copied in). One reduction a parameter and one host sync."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    names, finite = [], []
    for name, param in model.named_parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        if local.numel() and local.is_floating_point():
            names.append(name)
            finite.append(torch.isfinite(local.detach()).all())
    flags = torch.stack(finite).tolist() if finite else []
    bad = [name for name, ok in zip(names, flags, strict=True) if not ok]
    total = len(bad)
    if accelerator.num_processes > 1:
        count = torch.tensor([total], device=accelerator.device)
        dist.all_reduce(count)
        total = int(count.item())
    if total:
        here = (
            f"; on this rank: {', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}" if bad else ""
        )
        raise NonFiniteWeightsError(
            f"the trainer's weights hold NaN or infinity ({total} tensor(s){here}) after a "
            "training step; the weight sync was refused and the rollout actors keep the last "
            "weights they received. The step diverged: lower the learning rate, set "
            "max_grad_norm, or check the rewards and the loss."
        )


def send_to_pool(
    accelerator, model, transfer, lora: bool, probe=None, feed=None, on_sent=None
) -> tuple[float, float]:
    """One weight sync of `model` (the unwrapped trainer model) through `transfer` (rank 0's
    PoolWeightTransfer; other ranks may pass None), which every rank calls together. `feed`
    (rank_feed.RankFeed, colocated ranks): each rank sends to the actor beside it. `on_sent`:
    called on rank 0 once every rank has sent, before the actors resume (the trainer counts the
    new version there, so no sample of it can be scored against the old one). Returns the
    times the actors were paused and the transfer ended. Weights holding NaN or infinity are
    refused first (`refuse_non_finite`)."""
    from trl.experimental.async_grpo.async_grpo_trainer import _iter_vllm_named_params

    refuse_non_finite(accelerator, model)
    main = accelerator.is_main_process
    if main:
        transfer.pause()
    accelerator.wait_for_everyone()
    t_paused = time.time()
    if feed is not None:
        named = full_parameters(model, accelerator.device) if not lora else None
        specs = None if lora else [(n, tuple(p.shape)) for n, p in _iter_vllm_named_params(model)]
        feed.send(accelerator, model, transfer, lora, named, specs)
    elif lora:
        adapter = adapter_for_sync(model)  # every rank: the gathers are collectives
        if main:
            transfer.send_adapter(adapter)
    else:
        named = full_parameters(model, accelerator.device)
        if accelerator.num_processes == 1:
            transfer.send_weights(named)
        elif main:
            specs = [(n, tuple(p.shape)) for n, p in _iter_vllm_named_params(model)]
            transfer.send_weights(named, specs=specs, device=accelerator.device)
        else:
            for _ in named:  # the same gathers, in the same order, as rank 0's
                pass
    t_sent = time.time()
    accelerator.wait_for_everyone()
    if main:
        if on_sent is not None:
            on_sent()
        transfer.resume()
    if probe is not None:
        probe.run(accelerator, transfer if main else None)
    return t_paused, t_sent


@cache
def pool_trainer_class():
    from trl.experimental.async_grpo import AsyncGRPOTrainer

    class PoolAsyncGRPOTrainer(ShardedOnCpuRanks, RecordsMismatch, AsyncGRPOTrainer):
        """AsyncGRPOTrainer whose sync goes to the RolloutPool, across ranks (`send_to_pool`)."""

        lora = False
        parity = None  # the ParityProbe, attached by the builder
        feed = None  # colocated ranks: each rank's RankFeed

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            mode, cap = self.off_policy
            extra = {}
            if self.route_replay is not None:  # the packed row's tokens, as TRL forwards them
                routes = inputs["routes"][inputs["attention_mask"].bool()]
                extra[ROUTES_KWARG] = routes[None]
            forward = CorrectedForward(model, inputs, mode, cap, self.record_mismatch, extra)
            loss = super().compute_loss(forward, inputs, return_outputs, num_items_in_batch)
            self.record_routing()
            return loss

        def get_train_dataloader(self):
            if self.route_replay is None:
                return super().get_train_dataloader()
            from trl.experimental.async_grpo import async_grpo_trainer as trainer_module

            # TRL builds its planner and collator by these module-level names; the routed
            # planners and the routes-adding collator stand in while it does.
            names = ("DataCollatorForRollout", "TokenBudgetBatcher", "FixedCountBatcher")
            plain = {name: getattr(trainer_module, name) for name in names}
            trainer_module.DataCollatorForRollout = routes_collator_class()
            trainer_module.TokenBudgetBatcher = routed_planner_class(plain["TokenBudgetBatcher"])
            trainer_module.FixedCountBatcher = routed_planner_class(plain["FixedCountBatcher"])
            try:
                return super().get_train_dataloader()
            finally:
                for name, value in plain.items():
                    setattr(trainer_module, name, value)

        def _count_new_version(self) -> None:
            """The actors hold the new weights (still paused): the trainer's version and the
            rollout worker's move to it before any sample of it can reach the worker (after
            the resume, the parity probe runs while groups finish: a worker still at the old
            version would score them one version in the future)."""
            self.model_version += 1
            if self.rollout_worker:
                self.rollout_worker.update_model_version(self.model_version)

        def _sync_weight_merged(self, t0: float):
            model = self.accelerator.unwrap_model(self.model)
            transfer = self.weight_transfer if self.accelerator.is_main_process else None
            t_paused, t_sent = send_to_pool(
                self.accelerator,
                model,
                transfer,
                self.lora,
                self.parity,
                self.feed,
                on_sent=self._count_new_version,
            )
            # TRL logs pause, barrier and transfer; the pause is inside the first here.
            return t_paused, t_paused, t_sent

    return PoolAsyncGRPOTrainer
