"""Where the trainer and the actors go, and which backend syncs the weights, per GPU count."""

from __future__ import annotations

import pytest

from trainers.job.config import RolloutConfig
from trainers.job.placement import plan_placement, ray_visible_devices


def test_cpu_uses_cpu_actors_and_gloo() -> None:
    p = plan_placement(RolloutConfig(num_actors=2), num_gpus=0)
    assert (p.num_actors, p.gpus_per_actor, p.trainer_device) == (2, 0.0, "cpu")
    assert p.weight_sync_backend == "gloo"


def test_one_gpu_is_shared_and_syncs_over_cuda_ipc() -> None:
    p = plan_placement(RolloutConfig(), num_gpus=1)
    assert (p.num_actors, p.gpus_per_actor, p.trainer_device) == (1, 0.5, "cuda:0")
    assert p.engine_overrides["gpu_memory_utilization"] < 0.5
    assert p.weight_sync_backend == "cuda_ipc", "NCCL refuses two ranks on one GPU"
    assert p.engine_overrides["gpu_memory_utilization"] + p.trainer_memory_fraction <= 1.0
    forced = plan_placement(RolloutConfig(weight_sync_backend="gloo"), num_gpus=1)
    assert forced.weight_sync_backend == "gloo"


def test_several_gpus_give_the_trainer_the_first_and_nccl() -> None:
    p = plan_placement(RolloutConfig(num_actors=0), num_gpus=8)
    assert (p.num_actors, p.gpus_per_actor, p.trainer_device) == (7, 1.0, "cuda:0")
    assert p.ray_gpus == [1, 2, 3, 4, 5, 6, 7] and p.ray_init_kwargs == {"num_gpus": 7}
    assert p.weight_sync_backend == "nccl"
    assert plan_placement(RolloutConfig(num_actors=3), num_gpus=8).num_actors == 3


def test_explicit_nccl_without_own_gpus_is_an_error_that_says_what_to_use() -> None:
    with pytest.raises(ValueError, match="auto or gloo"):
        plan_placement(RolloutConfig(weight_sync_backend="nccl"), num_gpus=1)
    forced = plan_placement(RolloutConfig(weight_sync_backend="gloo"), num_gpus=2)
    assert forced.weight_sync_backend == "gloo"


def test_explicit_cuda_ipc_needs_a_shared_gpu() -> None:
    for gpus in (0, 2):
        with pytest.raises(ValueError, match="same GPU"):
            plan_placement(RolloutConfig(weight_sync_backend="cuda_ipc"), num_gpus=gpus)


def test_ray_visible_devices_map_through_an_existing_mask() -> None:
    assert ray_visible_devices([1, 2], {}) == "1,2"
    assert ray_visible_devices([1, 2], {"CUDA_VISIBLE_DEVICES": "4,5,6"}) == "5,6"


def test_the_users_engine_settings_win_over_the_placements() -> None:
    p = plan_placement(RolloutConfig(), num_gpus=1)
    settings = p.engine_settings({"gpu_memory_utilization": 0.3, "max_num_seqs": 8})
    assert settings == {"device": "cuda", "gpu_memory_utilization": 0.3, "max_num_seqs": 8}
    assert plan_placement(RolloutConfig(), num_gpus=0).trainer_memory_fraction is None
    assert plan_placement(RolloutConfig(), num_gpus=4).trainer_memory_fraction is None
