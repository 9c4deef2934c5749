"""The GRPO training job around the rollout engine, in three packages:

- job/          the job and what it runs, in order: config, input checks, placement, Ray, the
                trainer's run, checkpoints, the stop on a signal, console and summary
- trl_adapter/  every import and internal of TRL: the trainer of each mode wired to the pool
- task/         what is learned: the prompt datasets, the rewards, how a group is scored
"""
