"""The GRPO job and weight sync with rollout actors on GPUs (needs a CUDA GPU, and ray, trl and
datasets importable).

On one GPU the trainer and one actor share it (weights over CUDA IPC); with two or more GPUs the
trainer takes the first and an actor the next (weights over NCCL). Run the file once with
`CUDA_VISIBLE_DEVICES=0` and once with two GPUs to cover both placements.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_model

pytestmark = pytest.mark.gpu
ray = pytest.importorskip("ray")
pytest.importorskip("trl")


@pytest.mark.parametrize(
    "policy, mode, replay",
    [
        ("policy_dir", "streaming", False),
        ("moe_policy_dir", "streaming", False),
        ("moe_policy_dir", "streaming", True),
        ("policy_dir", "sync", False),
    ],
)
def test_three_grpo_steps_with_an_actor_on_the_gpu(
    tmp_path, policy, mode, replay, prompts_file, request
) -> None:
    """A dense and an MoE policy (the actor runs the MoE experts with the fused kernel; with
    routing replay it records their routes inside its CUDA graphs), and trl.GRPOTrainer (sync
    mode)."""
    from trainers.job import run_job
    from trainers.job.config_loading import load_config

    policy_dir = request.getfixturevalue(policy)

    config = load_config(
        None,
        [
            f"output_dir={tmp_path / 'run'}",
            f"model={policy_dir}",
            f"dataset.source={prompts_file}",
            "trainer.max_steps=3",
            f"trainer.mode={mode}",
            f"trainer.routing_replay={str(replay).lower()}",
            "trainer.num_generations=4",
            "trainer.prompts_per_step=2",
            "trainer.max_completion_length=16",
            "wandb.mode=disabled",
            "rollout.engine={max_model_len: 64, max_num_seqs: 32, dtype: float32,"
            " compile_model: false}",
        ],
    )
    summary = run_job(config)
    assert summary["steps"] == 3
    assert summary["sequences"] >= 3 * 2 * 4
    assert summary["weight_syncs"] >= 2, "trained weights went back to the GPU actor"
    parity = [d for d in summary["logprob_max_abs_diff"] if d is not None]
    # fp32 on both sides; the actor runs Triton paged attention and CUDA graphs.
    assert parity and max(parity) < 1e-3
    if replay:  # every training forward took the actor's routes
        assert summary["routing_flipped_fraction"] is not None
    expected_backend = "nccl" if torch.cuda.device_count() > 1 else "cuda_ipc"
    assert summary["weight_sync_backend"] == expected_backend


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_nccl_sync_to_an_actor_on_another_gpu(policy_dir) -> None:
    from trainers.job.seats_on_ray import ray_sees

    with ray_sees([1]):  # the actor on GPU 1, the trainer keeps GPU 0 (as the job places them)
        ray.init(address="local", num_gpus=1, include_dashboard=False, configure_logging=False)
    _sync_twice_and_compare(policy_dir, gpus_per_actor=1.0, backend="nccl", actor_gpu="1")


def test_cuda_ipc_sync_to_an_actor_sharing_the_trainers_gpu(policy_dir) -> None:
    from trainers.job.seats_on_ray import ray_sees

    with ray_sees([0]):  # the actor on GPU 0 with the trainer, as the job places them on one GPU
        ray.init(address="local", num_gpus=1, include_dashboard=False, configure_logging=False)
    _sync_twice_and_compare(policy_dir, gpus_per_actor=0.5, backend="cuda_ipc", actor_gpu="0")


def test_a_colocated_ranks_own_sender_reaches_the_actor_on_its_gpu(policy_dir) -> None:
    """What each colocated trainer rank does: its own RankWeightSender, lazily pulled buckets,
    over CUDA IPC to the actor on its GPU; the pool only plans and counts the version."""
    from trainers.job.seats_on_ray import ray_sees

    with ray_sees([0]):
        ray.init(address="local", num_gpus=1, include_dashboard=False, configure_logging=False)
    _sync_twice_and_compare(policy_dir, 0.5, "cuda_ipc", actor_gpu="0", from_rank=True)


def _sync_twice_and_compare(
    policy_dir, gpus_per_actor: float, backend: str, actor_gpu, from_rank: bool = False
) -> None:
    from rollout import EngineConfig
    from rollout.actors.pool import RolloutPool
    from rollout.actors.rank_sync import RankWeightSender
    from trainers.trl_adapter.parity import logprob_parity

    pool = None
    try:
        engine = EngineConfig(
            model=policy_dir,
            device="cuda",
            dtype="float32",
            max_model_len=64,
            compile_model=False,
            # a fixed cache, not a share of what is free: pytest-xdist's other workers use the
            # same GPU
            num_kv_blocks=64,
        )
        pool = RolloutPool(engine, 1, num_gpus_per_actor=gpus_per_actor)
        trainer_model = tiny_model("llama", seed=11).to("cuda:0")  # other weights than the actor's
        assert pool.probe([1, 2], max_tokens=1)["token_ids"], "the actor answers"
        if actor_gpu is not None:
            assert ray.get(pool.actors[0].gpu_ids.remote()) == [actor_gpu], "the actor's GPU"
        prompt = [5, 17, 33, 8]
        assert logprob_parity(pool, trainer_model, prompt) > 1e-2, "different weights differ"
        sender = RankWeightSender() if from_rank else None
        for _ in range(2):  # the second sync reuses the group
            pool.pause()
            if sender is None:
                result = pool.sync_weights(trainer_model.named_parameters(), backend=backend)
            else:
                plan = pool.rank_sync_plan(backend)
                specs = [(n, tuple(p.shape)) for n, p in trainer_model.named_parameters()]
                pulled = ((n, p.detach()) for n, p in trainer_model.named_parameters())
                result = sender.send_weights(plan, [0], pulled, specs, torch.device("cuda:0"))
                pool.ranks_synced(plan)
            pool.resume()
            assert result["bytes"] > 0
        assert pool.version == 2
        assert logprob_parity(pool, trainer_model, prompt) < 1e-4
    finally:
        if pool is not None:
            pool.shutdown()
        ray.shutdown()
