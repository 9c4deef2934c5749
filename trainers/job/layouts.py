"""Where the trainer ranks and the rollout actors run, planned from the cluster Ray sees.

`plan_placement(config, nodes, joining)` takes the cluster's nodes (seats_on_ray.cluster_nodes
reads them from a running Ray; `this_machine` describes the machine a Ray started here will have) and gives
every trainer rank and every actor a seat: a node, a GPU (or none) and its share of it. Layouts:

    cpu        no GPU in the cluster: ranks and actors on CPUs, weights over gloo
    shared     one GPU holds the trainer (one rank) and one actor, weights over CUDA IPC
    split      trainer ranks on GPUs of their own (packed on one node where one has room),
               actors on every other GPU, weights over NCCL
    colocated  each rank's GPU also holds an actor, which that rank syncs over CUDA IPC (on a
               cluster without GPUs: an actor beside each rank on its node, synced over gloo)

A layout the cluster cannot hold is a `PlacementError` naming what to change, before any work.
The seats' types are placement.py's; putting them into Ray (a placement group pinned to the
planned nodes) is seats_on_ray.py's.
"""

from __future__ import annotations

import dataclasses

from trainers.job.placement import (
    CPUS_PER_RANK,
    MIN_BUNDLE_CPU,
    SHARED_ENGINE_MEMORY,
    SHARED_TRAINER_MEMORY,
    Node,
    Placement,
    PlacementError,
    Seat,
)


def this_machine(num_gpus: int, cpus: float | None = None) -> Node:
    """The one node of a Ray the job starts here. Its CPUs are unbounded unless given: Ray's
    CPUs are only counts, and a Ray started here is given as many as the layout asks for
    (`local_ray_cpus`), so two CPU ranks and an actor run on a 2-core laptop, slowly."""
    return Node("local", "this machine", float(cpus or "inf"), num_gpus, True)


def plan_placement(
    rollout, num_processes: int, nodes: list[Node], joining: bool = False
) -> Placement:
    """The layout for `rollout` (RolloutConfig: num_actors, layout, cpus_per_actor,
    weight_sync_backend) and `num_processes` trainer ranks on `nodes`."""
    placement = _plan(rollout, num_processes, nodes, joining)
    wanted = rollout.weight_sync_backend
    if wanted == "auto" or wanted == placement.weight_sync_backend:
        return placement
    gpus = sum(n.gpus for n in nodes)
    if wanted == "nccl":
        raise PlacementError(
            "rollout.weight_sync_backend=nccl needs the trainer and every actor on GPUs of their "
            f"own (layout split); this layout is {placement.layout} on a cluster with {gpus} "
            "GPU(s). Use auto or gloo"
        )
    if wanted == "cuda_ipc":
        raise PlacementError(
            "rollout.weight_sync_backend=cuda_ipc needs the trainer and its actor on the same GPU "
            f"(layout shared or colocated); this layout is {placement.layout}. Use auto"
        )
    return dataclasses.replace(placement, weight_sync_backend=wanted)


def _plan(rollout, num_processes: int, nodes: list[Node], joining: bool) -> Placement:
    if num_processes < 1:
        raise PlacementError(f"trainer.num_processes={num_processes}: must be >= 1")
    total_gpus = sum(n.gpus for n in nodes)
    in_driver = not joining and num_processes == 1
    if total_gpus == 0:
        if rollout.layout == "colocated" and num_processes > 1:
            _check_colocated_actors(rollout, num_processes)
            placement = _cpu_layout(rollout, num_processes, nodes, in_driver, colocated=True)
            return dataclasses.replace(placement, layout="colocated")
        return _cpu_layout(rollout, num_processes, nodes, in_driver)
    layout = rollout.layout
    if layout == "auto":
        layout = "shared" if total_gpus == 1 and num_processes == 1 else "split"
    if num_processes > total_gpus:
        raise PlacementError(
            f"trainer.num_processes={num_processes} needs {num_processes} GPUs; the cluster has "
            f"{total_gpus}. Lower trainer.num_processes or add GPU nodes"
        )
    gpus = _gpu_slots(nodes, num_processes)
    if layout == "shared":
        if num_processes != 1 or rollout.num_actors > 1:
            raise PlacementError(
                "rollout.layout=shared puts one trainer rank and one actor on one GPU; with "
                f"trainer.num_processes={num_processes} and rollout.num_actors="
                f"{rollout.num_actors} use rollout.layout=colocated or split"
            )
        layout = "colocated"  # one GPU, one rank and its actor: colocated on one GPU
        shared = _colocated(rollout, gpus[:1], in_driver)
        return dataclasses.replace(shared, layout="shared")
    if layout == "colocated":
        _check_colocated_actors(rollout, num_processes)
        return _colocated(rollout, gpus[:num_processes], in_driver)
    return _split(rollout, num_processes, gpus, in_driver)


def _split(rollout, num_processes: int, gpus: list[tuple[Node, int]], in_driver: bool) -> Placement:
    """The trainer's ranks on the first `num_processes` GPUs, an actor on each of the next."""
    total_gpus = len(gpus)
    free = total_gpus - num_processes
    if free < 1:
        raise PlacementError(
            f"rollout.layout=split gives the trainer's {num_processes} rank(s) GPUs of their own "
            f"and needs at least one more for an actor; the cluster has {total_gpus}. Lower "
            "trainer.num_processes, or use rollout.layout=colocated (an actor beside each rank)"
        )
    actors = rollout.num_actors or free
    if actors > free:
        raise PlacementError(
            f"rollout.num_actors={rollout.num_actors}: the cluster has {free} GPU(s) beside the "
            f"trainer's {num_processes}; lower rollout.num_actors (0: one per free GPU)"
        )
    ranks = tuple(
        Seat("trainer", i, node, gpu, 1.0, 1.0, CPUS_PER_RANK)
        for i, (node, gpu) in enumerate(gpus[:num_processes])
    )
    engine_memory = 0.9
    seats = tuple(
        Seat("actor", i, node, gpu, 1.0, engine_memory, rollout.cpus_per_actor)
        for i, (node, gpu) in enumerate(gpus[num_processes : num_processes + actors])
    )
    local_gpus = None
    if in_driver:  # this process keeps cuda:0; a Ray started here hands out the others
        local_gpus = list(range(1, total_gpus))
    return Placement(
        layout="split",
        ranks=ranks,
        actors=seats,
        weight_sync_backend="nccl",
        trainer_in_driver=in_driver,
        engine_overrides={"device": "cuda"},
        ray_init_kwargs={"num_gpus": total_gpus - 1 if in_driver else total_gpus},
        ray_gpus=local_gpus,
    )


def _check_colocated_actors(rollout, num_processes: int) -> None:
    if (rollout.num_actors or num_processes) != num_processes:
        raise PlacementError(
            f"rollout.layout=colocated puts one actor beside each of the {num_processes} "
            f"trainer rank(s); rollout.num_actors={rollout.num_actors} must be 0 or "
            f"{num_processes}"
        )


def _colocated(rollout, gpus: list[tuple[Node, int]], in_driver: bool) -> Placement:
    ranks = tuple(
        Seat("trainer", i, node, gpu, 0.5, SHARED_TRAINER_MEMORY, CPUS_PER_RANK)
        for i, (node, gpu) in enumerate(gpus)
    )
    actors = tuple(
        Seat("actor", i, node, gpu, 0.5, SHARED_ENGINE_MEMORY, rollout.cpus_per_actor)
        for i, (node, gpu) in enumerate(gpus)
    )
    return Placement(
        layout="colocated",
        ranks=ranks,
        actors=actors,
        weight_sync_backend="cuda_ipc",
        trainer_in_driver=in_driver,
        engine_overrides={"device": "cuda", "gpu_memory_utilization": SHARED_ENGINE_MEMORY},
        trainer_memory_fraction=SHARED_TRAINER_MEMORY,
        # The driver's trainer and the actor share this machine's GPU 0: Ray sees that one.
        ray_init_kwargs={"num_gpus": 1},
        ray_gpus=[0] if in_driver else None,
    )


def _gpu_slots(nodes: list[Node], packed: int) -> list[tuple[Node, int]]:
    """Every GPU of the cluster as (node, number), the first `packed` on one node where a node
    has that many (the trainer's ranks: FSDP's collectives stay inside the node), the node this
    script runs on first among equals."""
    order = sorted(nodes, key=lambda n: (not n.driver,))
    home = next((n for n in order if n.gpus >= packed), None)
    if home is not None:
        order = [home] + [n for n in order if n is not home]
    return [(node, gpu) for node in order for gpu in range(node.gpus)]


def _cpu_layout(
    rollout, num_processes: int, nodes: list[Node], in_driver: bool, colocated: bool = False
) -> Placement:
    """No GPU: the ranks packed on the node with the most CPUs, then the actors first-fit;
    `colocated`: one actor per rank, on the ranks' node."""
    num_actors = num_processes if colocated else max(1, rollout.num_actors)
    room = {n.node_id: n.cpus for n in nodes}
    ranks: list[Seat] = []
    if in_driver:
        ranks.append(Seat("trainer", 0, next(n for n in nodes if n.driver), None, 0.0, None, 0.0))
    else:
        need = num_processes * CPUS_PER_RANK
        home = max(nodes, key=lambda n: room[n.node_id])
        if room[home.node_id] < need:
            raise PlacementError(
                f"trainer.num_processes={num_processes} needs {need:g} CPUs on one node; the "
                f"largest node has {room[home.node_id]:g}. Lower trainer.num_processes or add "
                "CPUs to a node"
            )
        room[home.node_id] -= need
        ranks = [
            Seat("trainer", i, home, None, 0.0, None, CPUS_PER_RANK) for i in range(num_processes)
        ]
    actors = []
    for i in range(num_actors):
        need = max(rollout.cpus_per_actor, MIN_BUNDLE_CPU)
        candidates = [ranks[0].node] if colocated else nodes
        node = next((n for n in candidates if room[n.node_id] >= need), None)
        if node is None and colocated:
            raise PlacementError(
                f"rollout.layout=colocated puts an actor beside each of the {num_processes} "
                f"trainer ranks on their node, which has room for {i} at rollout.cpus_per_actor="
                f"{rollout.cpus_per_actor:g}; lower rollout.cpus_per_actor or use another layout"
            )
        if node is None:
            raise PlacementError(
                f"rollout.num_actors={num_actors} at rollout.cpus_per_actor="
                f"{rollout.cpus_per_actor:g}: the cluster has room for {i} beside the trainer; "
                "lower rollout.num_actors or rollout.cpus_per_actor"
            )
        room[node.node_id] -= need
        actors.append(Seat("actor", i, node, None, 0.0, None, rollout.cpus_per_actor))
    return Placement(
        layout="cpu",
        ranks=tuple(ranks),
        actors=tuple(actors),
        weight_sync_backend="gloo",
        trainer_in_driver=in_driver,
        engine_overrides={"device": "cpu"},
    )
