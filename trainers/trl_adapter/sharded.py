"""The streaming trainer across ranks (FSDP2 through accelerate) and its weights to the pool.

`fsdp_args` are the TrainingArguments that turn FSDP2 on for a multi-rank run. `pool_trainer_class`
is AsyncGRPOTrainer with two changes:

- accelerate runs CPU ranks as plain DDP (it has no FSDP branch for CPU); the CPU ranks of a
  sharded run are switched to FSDP2 after the accelerator is made, so a CPU run shards, gathers
  and saves as a GPU run does;
- its weight sync goes to the pool: every rank gathers what rank 0 sends (each full tensor is a
  collective all ranks run in the same order), a whole bucket before its transfer starts (TRL's
  own sync interleaves the two and hangs, trl#7103); with LoRA only the adapter is gathered and
  sent (the actors merge it into their base weights); then the parity probe, whose forward every
  rank joins.
"""

from __future__ import annotations

import time
from functools import cache

from trainers.trl_adapter.lora import adapter_for_sync


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


@cache
def pool_trainer_class():
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
    from trl.experimental.async_grpo import AsyncGRPOTrainer
    from trl.experimental.async_grpo.async_grpo_trainer import _iter_vllm_named_params

    class PoolAsyncGRPOTrainer(AsyncGRPOTrainer):
        """AsyncGRPOTrainer whose sync goes to the RolloutPool (see the module's docstring)."""

        lora = False
        parity = None  # the ParityProbe, attached by the builder

        def create_accelerator_and_postprocess(self):
            super().create_accelerator_and_postprocess()
            state = self.accelerator.state
            plugin_args = self.args.fsdp_plugin_args
            if state.distributed_type == DistributedType.MULTI_CPU and plugin_args:
                state.distributed_type = DistributedType.FSDP
                state.fsdp_plugin = FullyShardedDataParallelPlugin(**plugin_args)
                self.is_fsdp_enabled = True

        def _sync_weight_merged(self, t0: float):
            accelerator = self.accelerator
            main = accelerator.is_main_process
            model = accelerator.unwrap_model(self.model)
            if main:
                self.weight_transfer.pause()
            t_pause = time.time()
            accelerator.wait_for_everyone()
            t_barrier = time.time()
            if self.lora:
                adapter = adapter_for_sync(model)  # every rank: the gathers are collectives
                if main:
                    self.weight_transfer.send_adapter(adapter)
            elif accelerator.num_processes == 1:
                if main:
                    self.weight_transfer.send_weights(self._streaming_iter())
            else:
                named = self._streaming_iter()
                if main:
                    specs = [(n, tuple(p.shape)) for n, p in _iter_vllm_named_params(model)]
                    self.weight_transfer.send_weights(named, specs=specs, device=accelerator.device)
                else:
                    for _ in named:  # the same gathers, in the same order, as rank 0's
                        pass
            t_transfer = time.time()
            accelerator.wait_for_everyone()
            if main:
                self.weight_transfer.resume()
            if self.parity is not None:
                self.parity.run(accelerator, self.weight_transfer if main else None)
            if main:
                self.model_version += 1
                if self.rollout_worker:
                    self.rollout_worker.update_model_version(self.model_version)
            return t_pause, t_barrier, t_transfer

    return PoolAsyncGRPOTrainer
