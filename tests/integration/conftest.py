"""Fixtures shared by the integration tests."""

from __future__ import annotations

import pytest

from rollout import EngineConfig
from rollout.actors.worker import RolloutWorker
from tests.conftest import tiny_model


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray instance of 4 CPUs for a module's actor tests, shut down after them."""
    ray = pytest.importorskip("ray")
    ray.init(
        address="local",
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """A saved tiny fp32 Llama (seed 4), the model the worker and pool tests serve."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_model("llama", seed=4).save_pretrained(path)
    return str(path)


@pytest.fixture
def make_worker(model_dir):
    """make_worker(**engine settings): a RolloutWorker (no Ray) on `model_dir`'s model on the
    CPU, shut down after the test."""
    made = []

    def make(**settings) -> RolloutWorker:
        config = EngineConfig(
            model=model_dir, device="cpu", dtype="float32", max_model_len=128, block_size=8,
            max_num_seqs=8, num_kv_blocks=32, **settings,
        )  # fmt: skip
        made.append(RolloutWorker(config))
        return made[-1]

    yield make
    for worker in made:
        worker.shutdown()


@pytest.fixture
def worker(make_worker):
    """A RolloutWorker (no Ray) on a tiny fp32 Llama on the CPU."""
    return make_worker()
