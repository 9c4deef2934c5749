"""The benchmark scripts' CPU paths: each writes the report a reader (or CI) can check."""

from __future__ import annotations

import importlib.util
import itertools
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


def test_bench_rollout_grpo_smoke_ends_every_sample_at_its_planned_length(
    tmp_path, monkeypatch
) -> None:
    from benchmarks.lib.workloads import GRPO_WORKLOADS

    monkeypatch.setenv("ROLLOUT_COMMIT", "abc1234")
    out = tmp_path / "grpo.json"
    _script("bench_rollout").main(["--workload", "grpo-smoke", "--json-out", str(out)])
    report = json.loads(out.read_text())
    workload = GRPO_WORKLOADS["grpo-smoke"]
    lengths = workload.sample_lengths()
    assert len(set(lengths)) > 1, "the smoke mix must have unequal lengths to test anything"
    assert report["group_size"] == workload.group_size and report["new_tokens"] is None
    assert [r["mode"] for r in report["runs"]] == ["sync", "overlap"]
    for run in report["runs"]:
        # The benchmark checks each completion against its plan; the total checks the plan.
        assert run["tokens"] == sum(lengths) == run["lengths"]["total"]
        assert (run["lengths"]["min"], run["lengths"]["max"]) == (min(lengths), max(lengths))
        assert sum(r["steps"] for r in run["regimes"].values()) == run["steps"]
        assert run["regimes"]["64+"]["steps"] == 0  # 16 samples in all
        assert sum(r["floor_steps"] for r in run["regimes"].values()) == max(lengths)
        assert run["steps"] >= max(lengths)  # one token per sample per step at most
        assert 0 < run["tail_s"] <= run["wall_s"] and run["tail_steps"] > 0
        # The prompts' blocks are shared by their samples: fewer than one copy per sample.
        assert 0 < run["kv_blocks_peak"] < run["kv_blocks_one_copy_peak"]
        assert run["floor_s"] is None  # CPU: no bandwidth floor
    assert out.with_suffix(".png").exists()


def test_bench_rollout_prefills_the_warm_up_prompts_again(tmp_path) -> None:
    """The warm-up runs the same prompts; the measured run must not take their KV from the
    prefix cache (its first step would be a shape the warm-up never compiled)."""
    out = tmp_path / "grpo.json"
    argv = ["--workload", "grpo-smoke", "--prompt-len", "40", "--modes", "overlap"]
    _script("bench_rollout").main([*argv, "--json-out", str(out)])
    (run,) = json.loads(out.read_text())["runs"]
    assert run["prefix_hit_tokens"] == 0 and run["preemptions"] == 0


def test_bench_rollout_grpo_flags_override_only_what_is_given() -> None:
    bench = _script("bench_rollout")
    parse = bench.argparse.Namespace

    def args(**given):
        flags = {flag[2:].replace("-", "_"): None for flag, _, _ in bench.GRPO_FLAGS}
        return parse(**{**flags, **given})

    smoke = bench._resolve_workload("grpo-smoke", args(prompts=2, length_max=32))
    assert (smoke.num_prompts, smoke.length_max, smoke.shape) == (2, 32, "tiny")
    assert (smoke.group_size, smoke.prompt_len, smoke.device) == (4, 16, "cpu")
    grpo = bench._resolve_workload("grpo", args())
    assert (grpo.shape, grpo.num_prompts, grpo.group_size, grpo.prompt_len) == (
        "qwen3-8b",
        16,
        8,
        600,
    )
    assert grpo.max_model_len == 600 + 16384 + 16
    with pytest.raises(SystemExit, match="only for the grpo workloads"):
        bench._resolve_workload("w1", args(group_size=4))
    with pytest.raises(SystemExit, match="unknown shape"):
        bench._resolve_workload("grpo", args(shape="no-such-shape"))
    with pytest.raises(SystemExit, match="length_min"):
        bench._resolve_workload("grpo", args(length_min=1))


def test_bench_rollout_length_plan_check_names_a_sample_off_its_plan() -> None:
    from rollout.engine.scheduling.sequence import Completion

    plan = _script("bench_rollout").LengthPlan(scheduler=None)
    plan.add("r0", 0, [3, 5])
    done = [Completion(0, [1], [7] * 3, [0.0] * 3, "length", request_id="r0")]
    plan.check(done, expect_all=False)
    with pytest.raises(AssertionError, match="completions for 2 planned"):
        plan.check(done, expect_all=True)
    done.append(Completion(1, [1], [7] * 4, [0.0] * 4, "length", request_id="r0"))
    with pytest.raises(AssertionError, match="r0 sample 1: 4 tokens .* planned 5"):
        plan.check(done, expect_all=True)


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
    schedule, build, pack, process = _script("bench_host").measure(8, 16, 32, steps=10)
    assert schedule > 0 and build > 0 and pack > 0 and process > 0
    # Verification steps: 2 drafts a sequence, rejected by the random tokens, every step.
    times = _script("bench_host").measure(8, 16, 64, steps=10, verify_drafts=2)
    assert all(t > 0 for t in times)


def test_decode_tile_changes_refuse_an_unknown_field_before_any_work() -> None:
    for argv in (["--decode-tiles", "no_such_field=1"], ["--decode-tiles", "split_len=big"]):
        with pytest.raises(SystemExit, match="KEY=INT"):
            _script("bench_rollout").main(["--workload", "grpo-smoke", *argv])
    with pytest.raises(SystemExit, match="merge_pairs must be a power of two"):
        _script("bench_rollout").main(
            ["--workload", "grpo-smoke", "--decode-tiles", "merge_pairs=48"]
        )


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


def test_bench_multi_turn_smoke_matches_the_single_turn_tokens(tmp_path) -> None:
    out = tmp_path / "multi_turn.json"
    _script("bench_multi_turn").main(["--smoke", "--json-out", str(out)])
    report = json.loads(out.read_text())
    single, multi = report["runs"]
    assert single["model_tokens"] == multi["model_tokens"] == 2 * 3 * 3 * 8
    assert multi["prefix_hit_tokens"] > 0 and multi["tool_s_total"] > 0


def test_bench_decode_regimes_smoke_times_each_point(tmp_path) -> None:
    out = tmp_path / "regimes.json"
    _script("bench_decode_regimes").main(
        ["--smoke", "--verify-drafts", "3", "--json-out", str(out)]
    )
    report = json.loads(out.read_text())
    assert [(p["batch"], p["context"]) for p in report["points"]] == [(1, 16), (4, 32)]
    assert all(p["ms_per_step"] > 0 and p["verify_ms_per_step"] > 0 for p in report["points"])
    # Every sequence verified every step; random drafts are rejected, so one token each.
    assert all(p["verifications_per_step"] == p["batch"] for p in report["points"])
    assert all(1 <= p["tokens_per_verification"] < 1.5 for p in report["points"])


def test_bench_decode_regimes_names_kernel_kinds() -> None:
    kind = _script("bench_decode_regimes").kernel_kind
    assert kind("nvjet_tst_128x64_64x8_1x1_v_bz_coopB_TNN") == "gemm"
    assert kind("_decode_kernel") == "attention"
    assert kind("triton_red_fused_add_mean_mul_pow_rsqrt_0") == "fused norms and elementwise"
    assert kind("_gate_up_kernel") == "moe experts"
    assert kind("_counting_sort_kernel") == "moe routing"
    assert kind("void at::native::radixSortKVInPlace<-2, -1, 32, 32, long, long>") == "moe routing"
    assert kind("_sample_kernel") == "sampler"
    assert kind("something_else") == "other"
    with pytest.raises(SystemExit, match="is not BxC"):
        _script("bench_decode_regimes").parse_points("8x2048,oops")


def test_bench_mismatch_smoke_reports_each_position_bucket(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ROLLOUT_COMMIT", "abc1234")
    out = tmp_path / "mismatch.json"
    _script("bench_mismatch").main(["--smoke", "--json-out", str(out)])
    report = json.loads(out.read_text())
    assert report["commit"] == "abc1234" and report["route_bytes_per_token"] == 2 * 4
    assert set(report["runs"]) == {"own_routing", "replayed_routes"}
    for rows in report["runs"].values():
        assert [r["positions"] for r in rows] == [[0, 40]] and rows[0]["tokens"] == 2 * 40
        assert rows[0]["abs_dlogp_max"] < 1e-4  # fp32 on CPU: the same model twice
    assert report["runs"]["own_routing"][0]["flipped_fraction"] == 0.0
    dense = _script("bench_mismatch").main(
        ["--shape", "tiny", "--samples", "2", "--length", "40", "--prompt-len", "8"]
    )
    assert list(dense["runs"]) == ["own_routing"] and dense["route_bytes_per_token"] == 0


def test_bench_mismatch_with_fp8_separates_the_rounding_from_the_kernels() -> None:
    report = _script("bench_mismatch").main(["--smoke", "--weight-quantization", "fp8"])
    runs = report["runs"]
    assert list(runs) == ["fp8_model_trainer", "own_routing", "replayed_routes"]
    # against the rounded model the engine is exact (fp32, CPU); against bf16 it drifts
    assert runs["fp8_model_trainer"][0]["abs_dlogp_max"] < 1e-4
    assert runs["own_routing"][0]["abs_dlogp_mean"] > 1e-3
    assert runs["replayed_routes"][0]["abs_dlogp_mean"] > 1e-3


def test_bench_mismatch_with_the_heads_input_rounded_adds_to_the_drift() -> None:
    """--fp8-lm-head-input: the engine's LM head rounds its input too, which the trainer with the
    rounded weights (and unrounded inputs) does not: the run with it drifts further."""
    common = ["--shape", "tiny", "--samples", "2", "--length", "24", "--prompt-len", "8",
              "--weight-quantization", "fp8", "--activation-quantization", "fp8", "--fp8-lm-head"]  # fmt: skip
    without = _script("bench_mismatch").main(common)["runs"]["fp8_model_trainer"][0]
    report = _script("bench_mismatch").main([*common, "--fp8-lm-head-input"])
    assert report["fp8_lm_head_input"] is True
    with_input = report["runs"]["fp8_model_trainer"][0]
    assert with_input["abs_dlogp_mean"] > without["abs_dlogp_mean"]


def test_bench_mismatch_on_the_trained_checkpoint_with_an_fp8_cache() -> None:
    """--model smollm2: the built-in trained model, prompted with a chat question; with FP8
    weights and cache the engine drifts from the fp32 trainer, and against the rounded weights
    only the cache's rounding is left."""
    report = _script("bench_mismatch").main(
        ["--model", "smollm2", "--samples", "2", "--length", "24", "--weight-quantization", "fp8",
         "--kv-cache-dtype", "fp8", "--question", "Name three colours."]
    )  # fmt: skip
    assert report["shape"] == "smollm2" and report["kv_cache_dtype"] == "fp8"
    assert report["prompt_len"] > 8  # the chat template around the question
    runs = report["runs"]
    assert list(runs) == ["fp8_model_trainer", "own_routing"]
    assert runs["own_routing"][0]["tokens"] == 2 * 24
    assert runs["own_routing"][0]["abs_dlogp_mean"] > runs["fp8_model_trainer"][0]["abs_dlogp_mean"]
    assert runs["fp8_model_trainer"][0]["abs_dlogp_mean"] > 1e-4  # the cache is rounded
    with pytest.raises(SystemExit, match="no transformers folder"):
        _script("bench_mismatch").main(["--model", "/nonexistent/folder"])


def test_bench_attention_points_give_even_or_mixed_contexts() -> None:
    contexts = _script("bench_attention").point_contexts
    assert contexts("4x2048") == [2048] * 4
    mixed = contexts("64x2048~")
    assert len(mixed) == 64 and mixed == contexts("64x2048~")  # seeded: the same batch each run
    assert min(mixed) >= 256 and max(mixed) <= 16384 and len(set(mixed)) > 32
    assert sorted(mixed)[32] in range(1024, 4096)  # about its median
    for bad in ("64", "x2048", "0x2048", "64x2k"):
        with pytest.raises(SystemExit, match="--points"):
            contexts(bad)


def test_compare_steps_lines_up_grpo_runs_step_by_step(tmp_path, capsys) -> None:
    report = tmp_path / "a.json"
    _script("bench_rollout").main(
        ["--workload", "grpo-smoke", "--modes", "overlap", "--json-out", str(report)]
    )
    data = json.loads(report.read_text())
    data["runs"][0]["step_ms"] = [2 * t for t in data["runs"][0]["step_ms"]]
    twice = tmp_path / "b.json"
    twice.write_text(json.dumps(data))
    compare = _script("compare_steps")
    rows = compare.compare([str(report), str(twice)], "overlap", [16, 8, 4, 2, 1])
    assert rows and all(abs(r["ratio"][1] - 2.0) < 1e-9 for r in rows)
    assert rows[0]["running"][0] == 16 and rows[-1]["running"][1] >= 1
    steps = [r["steps"] for r in rows]
    assert all(a[1] == b[0] for a, b in itertools.pairwise(steps))  # windows follow each other
    data["length_distribution"]["seed"] = 1
    other = tmp_path / "c.json"
    other.write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="another workload"):
        compare.compare([str(report), str(other)], "overlap", [8])
    compare.main([str(report), str(twice)])
    assert "b / a" in capsys.readouterr().out


def test_bench_attention_shares_a_groups_prefix_pages_only() -> None:
    import torch

    tables = torch.arange(24, dtype=torch.int32).view(4, 6)
    shared = _script("bench_attention").share_prefix(tables, 2, 2)
    assert shared[:, :2].tolist() == [[0, 1], [0, 1], [12, 13], [12, 13]]
    assert torch.equal(shared[:, 2:], tables[:, 2:])  # past the prefix: each row its own pages
    assert _script("bench_attention").share_prefix(tables, 0, 2) is tables
