"""Where the trainer ranks and the actors go on a cluster's nodes, and which backend syncs."""

from __future__ import annotations

import pytest

from trainers.job.config_sections import RolloutConfig
from trainers.job.layouts import plan_placement, this_machine
from trainers.job.placement import Node, PlacementError
from trainers.job.seats_on_ray import ray_visible_devices


def _nodes(*gpus: int, cpus: float = 16.0) -> list[Node]:
    """A cluster: the first node is the one the job runs on."""
    return [Node(f"node{i}", f"10.0.0.{i}", cpus, g, driver=i == 0) for i, g in enumerate(gpus)]


def test_cpu_uses_cpu_actors_and_gloo() -> None:
    p = plan_placement(RolloutConfig(num_actors=2), 1, [this_machine(0, cpus=4)])
    assert (p.num_actors, p.gpus_per_actor, p.trainer_device) == (2, 0.0, "cpu")
    assert p.weight_sync_backend == "gloo" and p.trainer_in_driver and p.layout == "cpu"
    assert plan_placement(RolloutConfig(num_actors=0), 1, [this_machine(0)]).num_actors == 1


def test_one_gpu_is_shared_and_syncs_over_cuda_ipc() -> None:
    p = plan_placement(RolloutConfig(), 1, [this_machine(1)])
    assert (p.num_actors, p.gpus_per_actor, p.trainer_device) == (1, 0.5, "cuda:0")
    assert p.layout == "shared" and p.trainer_in_driver
    assert p.weight_sync_backend == "cuda_ipc", "NCCL refuses two ranks on one GPU"
    assert p.engine_overrides["gpu_memory_utilization"] + p.trainer_memory_fraction <= 1.0
    assert p.ranks[0].gpu == p.actors[0].gpu == 0
    forced = plan_placement(RolloutConfig(weight_sync_backend="gloo"), 1, [this_machine(1)])
    assert forced.weight_sync_backend == "gloo"


def test_several_local_gpus_give_the_trainer_the_first_and_nccl() -> None:
    p = plan_placement(RolloutConfig(num_actors=0), 1, [this_machine(8)])
    assert (p.num_actors, p.gpus_per_actor, p.trainer_device) == (7, 1.0, "cuda:0")
    assert p.ray_gpus == [1, 2, 3, 4, 5, 6, 7] and p.ray_init_kwargs == {"num_gpus": 7}
    assert p.weight_sync_backend == "nccl" and p.layout == "split"
    assert plan_placement(RolloutConfig(num_actors=3), 1, [this_machine(8)]).num_actors == 3


def test_a_head_without_gpus_still_plans_the_clusters_gpus() -> None:
    # `ray job submit`: the job runs on a CPU head; the GPUs are on the workers.
    nodes = [Node("head", "10.0.0.1", 8, 0, driver=True)]
    nodes += [Node(f"w{i}", f"10.0.1.{i}", 64, 8) for i in range(2)]
    p = plan_placement(RolloutConfig(), 4, nodes, joining=True)
    assert not p.trainer_in_driver and p.layout == "split"
    assert {s.node.node_id for s in p.ranks} == {"w0"}, "a trainer's ranks share one node"
    assert [s.gpu for s in p.ranks] == [0, 1, 2, 3]
    assert p.num_actors == 12 and p.weight_sync_backend == "nccl"
    seats = {(s.node.node_id, s.gpu) for s in (*p.ranks, *p.actors)}
    assert len(seats) == 16, "every GPU holds one process"


def test_ranks_spread_over_nodes_only_when_no_node_holds_them() -> None:
    p = plan_placement(RolloutConfig(), 6, _nodes(4, 4), joining=True)
    assert [s.node.node_id for s in p.ranks] == ["node0"] * 4 + ["node1"] * 2
    assert p.num_actors == 2


def test_colocated_puts_an_actor_beside_the_rank() -> None:
    p = plan_placement(RolloutConfig(layout="colocated"), 1, _nodes(4), joining=True)
    assert p.weight_sync_backend == "cuda_ipc" and p.num_actors == 1
    assert [(s.node, s.gpu) for s in p.ranks] == [(s.node, s.gpu) for s in p.actors]
    assert all(s.gpu_share == 0.5 for s in (*p.ranks, *p.actors))
    assert not p.each_rank_syncs_its_actor, "one rank: the pool's own sync"


def test_colocated_ranks_each_sync_the_actor_on_their_gpu() -> None:
    p = plan_placement(RolloutConfig(layout="colocated"), 4, _nodes(2, 4), joining=True)
    assert p.layout == "colocated" and p.each_rank_syncs_its_actor
    assert p.weight_sync_backend == "cuda_ipc" and p.num_actors == 4
    assert [(s.node.node_id, s.gpu) for s in p.ranks] == [("node1", g) for g in range(4)]
    assert [(s.node, s.gpu) for s in p.ranks] == [(s.node, s.gpu) for s in p.actors]


def test_colocated_on_cpus_puts_each_actor_on_its_ranks_node() -> None:
    nodes = [Node("head", "h", 1, 0, driver=True), Node("worker", "w", 4, 0)]
    p = plan_placement(RolloutConfig(layout="colocated"), 2, nodes, joining=True)
    assert p.layout == "colocated" and p.each_rank_syncs_its_actor
    assert p.weight_sync_backend == "gloo" and p.trainer_device == "cpu"
    assert [s.node.node_id for s in (*p.ranks, *p.actors)] == ["worker"] * 4
    with pytest.raises(PlacementError, match="has room for 1 at rollout.cpus_per_actor=1"):
        plan_placement(RolloutConfig(layout="colocated"), 2, _nodes(0, cpus=3), joining=True)
    one = plan_placement(RolloutConfig(layout="colocated"), 1, [this_machine(0)])
    assert one.layout == "cpu" and not one.each_rank_syncs_its_actor


def test_layouts_the_cluster_cannot_hold_are_one_line_errors() -> None:
    cases = [
        (RolloutConfig(), 3, _nodes(2), "trainer.num_processes=3 needs 3 GPUs; the cluster has 2"),
        (RolloutConfig(), 2, _nodes(2), "needs at least one more for an actor"),
        (RolloutConfig(num_actors=5), 1, _nodes(4), "rollout.num_actors=5"),
        (RolloutConfig(layout="shared"), 2, _nodes(2), "rollout.layout=shared"),
        (RolloutConfig(layout="colocated", num_actors=2), 1, _nodes(2), "must be 0 or 1"),
        (RolloutConfig(num_actors=4), 2, _nodes(0, cpus=3), "room for 1 beside the trainer"),
        (RolloutConfig(), 4, _nodes(0, 0, cpus=2), "needs 4 CPUs on one node"),
    ]
    for rollout, ranks, nodes, message in cases:
        with pytest.raises(PlacementError, match=message.replace("(", r"\(")) as err:
            plan_placement(rollout, ranks, nodes, joining=True)
        assert "\n" not in str(err.value)


def test_cpu_ranks_pack_on_the_roomiest_node_and_actors_fill_the_rest() -> None:
    nodes = [Node("head", "h", 1, 0, driver=True), Node("worker", "w", 3, 0)]
    p = plan_placement(RolloutConfig(num_actors=2), 2, nodes, joining=True)
    assert [s.node.node_id for s in p.ranks] == ["worker", "worker"]
    assert [s.node.node_id for s in p.actors] == ["head", "worker"]


def test_explicit_backends_must_fit_the_layout() -> None:
    with pytest.raises(PlacementError, match="auto or gloo"):
        plan_placement(RolloutConfig(weight_sync_backend="nccl"), 1, [this_machine(1)])
    forced = plan_placement(RolloutConfig(weight_sync_backend="gloo"), 1, [this_machine(2)])
    assert forced.weight_sync_backend == "gloo"
    for gpus in (0, 2):
        with pytest.raises(PlacementError, match="same GPU"):
            plan_placement(RolloutConfig(weight_sync_backend="cuda_ipc"), 1, [this_machine(gpus)])


def test_the_plan_names_every_seat() -> None:
    p = plan_placement(RolloutConfig(), 2, _nodes(4), joining=True)
    lines = p.describe()
    assert lines[0].startswith("layout split: 2 trainer rank(s), 2 rollout actor(s)")
    assert sum("trainer rank" in line for line in lines[1:]) == 2
    assert sum(line.strip().startswith("actor") for line in lines) == 2
    assert all("10.0.0.0" in line and "GPU" in line for line in lines[1:])


def test_ray_visible_devices_map_through_an_existing_mask() -> None:
    assert ray_visible_devices([1, 2], {}) == "1,2"
    assert ray_visible_devices([1, 2], {"CUDA_VISIBLE_DEVICES": "4,5,6"}) == "5,6"


def test_the_users_engine_settings_win_over_the_placements() -> None:
    p = plan_placement(RolloutConfig(), 1, [this_machine(1)])
    settings = p.engine_settings({"gpu_memory_utilization": 0.3, "max_num_seqs": 8})
    assert settings == {"device": "cuda", "gpu_memory_utilization": 0.3, "max_num_seqs": 8}
    assert plan_placement(RolloutConfig(), 1, [this_machine(0)]).trainer_memory_fraction is None
    assert plan_placement(RolloutConfig(), 1, [this_machine(4)]).trainer_memory_fraction is None
