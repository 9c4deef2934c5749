"""The Ray layer: rollout actors, the pool that feeds and drains them, and what travels between.

    worker.py    RolloutWorker: one engine on its own thread (a plain class; a Ray actor at spawn)
    pool.py      RolloutPool: groups to the least-loaded actor, samples streamed back, failover
    pool_weights.py  the pool's side of a weight sync: one group of the trainer and every live actor
    messages.py  GroupRequest, FinishedSample, CompletedGroup
    metrics.py   the per-actor metrics the pool reports to W&B

Ray itself is imported only where actors are spawned (`RolloutPool`), so the worker runs and is
tested without it.
"""
