"""load_format="dummy": an engine from a config.json alone (benchmarks, drills)."""

from __future__ import annotations

import pytest

from benchmarks.lib.workloads import TINY, write_model_config
from rollout import EngineConfig, LLMEngine, SamplingParams


def test_dummy_weights_from_config_only(tmp_path) -> None:
    folder = write_model_config(TINY, tmp_path / "tiny")
    assert {p.name for p in (tmp_path / "tiny").iterdir()} == {"config.json"}
    engine = LLMEngine(
        EngineConfig(model=folder, load_format="dummy", device="cpu", max_model_len=64)
    )
    (result,) = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=5, ignore_eos=True))
    assert len(result.token_ids) == 5 and result.finish_reason == "length"


def test_dummy_without_config_says_what_is_missing(tmp_path) -> None:
    with pytest.raises(ValueError, match="config.json"):
        LLMEngine(EngineConfig(model=str(tmp_path), load_format="dummy", device="cpu"))


def test_unknown_load_format_is_rejected() -> None:
    with pytest.raises(ValueError, match="load_format"):
        EngineConfig(model="x", load_format="safetensors-please")
