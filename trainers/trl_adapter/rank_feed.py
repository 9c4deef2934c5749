"""Colocated trainer ranks: each rank sends its weights to the rollout actor beside it.

CUDA IPC reaches only an actor on the sender's own GPU, so with several colocated ranks
(`Placement.each_rank_syncs_its_actor`) rank i feeds actor i. Every rank gathers the full
tensors anyway (a sharded parameter's gather is a collective whose result every rank holds), so
no rank sends more than one GPU's worth. Rank 0's pool plans the sync (the live actors, the
version) and broadcasts the plan; every rank sends; rank 0 records the sync once all have.
"""

from __future__ import annotations

from trainers.trl_adapter.lora import adapter_for_sync


class RankFeed:
    """One per trainer rank, kept for the run (its sender keeps its weight-sync group)."""

    def __init__(self) -> None:
        self._sender = None

    def send(self, accelerator, model, transfer, lora: bool, named, specs) -> None:
        """Every rank calls this together; `transfer` is rank 0's PoolWeightTransfer (None on
        the others); `named` yields the full tensors in the order of `specs`."""
        from accelerate.utils import broadcast_object_list, gather_object

        from rollout.actors.rank_sync import RankWeightSender

        main = accelerator.is_main_process
        plan = transfer.pool.rank_sync_plan(transfer.backend) if main else None
        plan = broadcast_object_list([plan], from_process=0)[0]
        rank = accelerator.process_index
        mine = [rank] if rank in plan.actors else []  # a dead actor's rank sends nothing
        if self._sender is None:
            self._sender = RankWeightSender()
        result = None
        if lora:
            adapter = adapter_for_sync(model)  # every rank: the gathers are collectives
            if mine:
                result = self._sender.send_adapter(plan, mine, adapter)
        elif mine:
            result = self._sender.send_weights(plan, mine, named, specs, accelerator.device)
        else:
            for _ in named:  # the same gathers, in the same order, as the other ranks'
                pass
        results = [r for r in gather_object([result]) if r is not None]
        if main:
            transfer.pool.ranks_synced(plan)
            transfer.history.append(
                {
                    "seconds": max(r["seconds"] for r in results),
                    "bytes": sum(r["bytes"] for r in results),
                    "version": plan.version,
                    "ranks": len(results),
                }
            )
