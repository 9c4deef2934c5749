"""Fixtures shared by the integration tests."""

from __future__ import annotations

import pytest

from rollout import EngineConfig
from rollout.actors.worker import RolloutWorker
from tests.conftest import tiny_model


@pytest.fixture
def worker(tmp_path):
    """A RolloutWorker (no Ray) on a tiny fp32 Llama on the CPU."""
    path = tmp_path / "tiny-llama"
    tiny_model("llama", seed=4).save_pretrained(path)
    config = EngineConfig(
        model=str(path), device="cpu", dtype="float32", max_model_len=128, block_size=8,
        max_num_seqs=8, num_kv_blocks=32,
    )  # fmt: skip
    worker = RolloutWorker(config)
    yield worker
    worker.shutdown()
