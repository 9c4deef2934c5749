"""The benchmark scripts' CPU paths: each writes the report a reader (or CI) can check."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_rollout_smoke_writes_runs_and_a_plot(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ROLLOUT_COMMIT", "abc1234")
    out = tmp_path / "smoke.json"
    _script("bench_rollout").main(["--smoke", "--json-out", str(out)])
    report = json.loads(out.read_text())
    assert report["commit"] == "abc1234"
    assert [r["mode"] for r in report["runs"]] == ["sync", "overlap"]
    for run in report["runs"]:
        assert run["tokens"] == 8 * 32 and run["tokens_per_s"] > 0
    assert out.with_suffix(".png").exists()


def test_bench_rollout_engine_overrides_are_checked_before_any_work() -> None:
    bench = _script("bench_rollout")
    assert bench._engine_overrides(["triton_linear=false", "block_size=32"]) == {
        "triton_linear": False,
        "block_size": 32,
    }
    with pytest.raises(SystemExit, match="unknown engine config key"):
        bench._engine_overrides(["no_such_setting=1"])
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        bench._engine_overrides(["triton_linear"])


def test_bench_host_times_each_part_of_a_decode_step() -> None:
    schedule, build, process = _script("bench_host").measure(8, 16, 32, steps=10)
    assert schedule > 0 and build > 0 and process > 0


@pytest.mark.slow
def test_bench_scale_smoke_streams_every_token_and_times_the_sync(tmp_path) -> None:
    pytest.importorskip("ray")
    out = tmp_path / "scale.json"
    _script("bench_scale").main(["--smoke", "--actors", "1,2", "--json-out", str(out)])
    report = json.loads(out.read_text())
    assert [r["actors"] for r in report["runs"]] == [1, 2]
    for run in report["runs"]:
        assert run["tokens"] == run["actors"] * 8 * 32  # each actor ran the whole request mix
        assert sum(run["tokens_per_actor"].values()) == run["tokens"]
        assert len(run["tokens_per_actor"]) == run["actors"]
        (sync,) = run["weight_sync"]
        assert sync["backend"] == "gloo" and sync["gib"] > 0
        assert len(sync["sync_s"]) == 3
    assert report["runs"][0]["efficiency"] == 1.0


@pytest.mark.slow
def test_bench_trainer_step_smoke_trains_every_completion_token(tmp_path, monkeypatch) -> None:
    pytest.importorskip("trl")
    from rollout.builtin_models import smollm2_path

    monkeypatch.setenv("ROLLOUT_COMMIT", "abc1234")
    out = tmp_path / "trainer.json"
    tokenizer = str(smollm2_path())  # the built-in model's folder holds its tokenizer
    _script("bench_trainer_step").main(
        ["--smoke", "--tokenizer", tokenizer, "--json-out", str(out)]
    )
    report = json.loads(out.read_text())
    assert report["commit"] == "abc1234"
    assert report["steps"] == 2
    # 2 prompts x 4 samples x 32 completion tokens: a step holds all of its samples.
    assert report["trained_tokens_per_step"] == 2 * 4 * 32
    assert report["step_time_split_s"]["step"] > 0 and report["trained_tokens_per_s"] > 0
