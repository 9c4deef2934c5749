"""Fixtures shared by the integration tests."""

from __future__ import annotations

import pytest

from rollout import EngineConfig
from rollout.actors.worker import RolloutWorker
from tests.conftest import tiny_model


@pytest.fixture
def make_worker(tmp_path):
    """make_worker(**engine settings): a RolloutWorker (no Ray) on a tiny fp32 Llama on the CPU,
    shut down after the test."""
    path = tmp_path / "tiny-llama"
    tiny_model("llama", seed=4).save_pretrained(path)
    made = []

    def make(**settings) -> RolloutWorker:
        config = EngineConfig(
            model=str(path), device="cpu", dtype="float32", max_model_len=128, block_size=8,
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
