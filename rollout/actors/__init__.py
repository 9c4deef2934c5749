"""The Ray layer: rollout actors, the pool that feeds and drains them, and what travels between.

    worker.py            RolloutWorker: one engine on its own thread (a Ray actor at spawn)
    weight_receiver.py   the worker's side of a sync: group, version, torn state, parity probe
    adapter_merge.py     a LoRA adapter merged into a snapshot of the base weights
    groups_in_flight.py  the worker's groups, and the one builder of each FinishedSample
    pool.py              RolloutPool: groups to the least-loaded actor, samples back, failover
    pool_syncs.py        the pool's sync methods: weights or adapter to every live actor
    pool_weights.py      the pool's side of a sync: one group of the trainer and live actors
    messages.py          GroupRequest, FinishedSample, CompletedGroup, ActorDeath
    metrics.py           the per-actor metrics the pool reports to W&B

Ray itself is imported only where actors are spawned (`RolloutPool`), so the worker runs and is
tested without it.
"""
