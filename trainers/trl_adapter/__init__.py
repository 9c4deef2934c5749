"""The TRL adapter: every import of TRL and every touch of its trainers' internals lives in this
package (tested with trl==1.16.0, pinned in pyproject.toml).

- builder.py         the job's trainer: picks the mode, builds what both modes share
- streaming.py       streaming mode: AsyncGRPOTrainer fed by PoolRolloutWorker
- rollout_worker.py  PoolRolloutWorker: the pool's groups scored into TRL's queue
- staleness.py       each sample's version by trainer.staleness; the gate that drops stale ones
- off_policy.py      trainer.off_policy_correction in both modes' losses, the mismatch logged
- across_ranks.py    a step's logged figures summed or maxed over the trainer's ranks
- routing_replay.py  trainer.routing_replay: the trainer's routers take the rollout's experts;
                     replay_batches.py lays the routes out like each mode's batch
- sharded.py         streaming mode across ranks: FSDP2 through accelerate (CPU ranks too), and
                     the sync from sharded parameters, gathered a whole bucket before its transfer
- sync.py            sync mode: trl.GRPOTrainer with a rollout_func on the pool
- args.py            the TRL arguments both modes share
- weight_sync.py     the weights (or a LoRA adapter) to the pool after a step; parity.py checks them
- lora.py            PEFT's LoRA: its config, the adapter a sync sends, the merged final model
- tree_attention.py  AsyncGRPOTrainer's packed-row attention without a Hub kernel
- rollout_logging.py the rollout side in the trainer's logs, and the step time split
"""

from trainers.trl_adapter.builder import BuiltTrainer, JobInputs, build_trainer
from trainers.trl_adapter.rollout_logging import attach_rollout_logging, step_time_split

TRL_VERSION = "1.16.0"

__all__ = [
    "TRL_VERSION",
    "BuiltTrainer",
    "JobInputs",
    "attach_rollout_logging",
    "build_trainer",
    "step_time_split",
]
