"""EngineConfig: every field is validated, the object is frozen, from_dict rejects unknown keys."""

from __future__ import annotations

import dataclasses

import pytest

from rollout.engine.config import EngineConfig

POSITIVE_INT_FIELDS = ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "block_size")


def test_defaults_are_valid():
    config = EngineConfig()
    assert config.dtype == "auto"
    assert config.device == "auto"
    assert config.attention == "auto"
    assert config.num_kv_blocks is None
    assert 0 < config.gpu_memory_utilization <= 1


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dtype", "fp32"),
        ("dtype", "float64"),
        ("dtype", "BFLOAT16"),
        ("dtype", None),
        ("device", "gpu"),
        ("device", "cuda:0"),
        ("device", ""),
        ("attention", "flash"),
        ("attention", "Torch"),
    ],
)
def test_bad_choice_raises_naming_field(field, value):
    with pytest.raises(ValueError, match=rf"^{field} must be one of") as info:
        EngineConfig(**{field: value})
    assert repr(value) in str(info.value)


@pytest.mark.parametrize(
    ("field", "value"),
    [("dtype", d) for d in ("auto", "float32", "bfloat16", "float16")]
    + [("device", d) for d in ("auto", "cpu", "cuda")]
    + [("attention", a) for a in ("auto", "torch", "triton")],
)
def test_good_choice_accepted(field, value):
    assert getattr(EngineConfig(**{field: value}), field) == value


@pytest.mark.parametrize("field", POSITIVE_INT_FIELDS + ("num_kv_blocks",))
@pytest.mark.parametrize("value", [0, -1, 2.0, "8", True, False])
def test_non_positive_or_non_int_rejected(field, value):
    with pytest.raises(ValueError, match=rf"^{field} must be a positive int"):
        EngineConfig(**{field: value})


@pytest.mark.parametrize("field", POSITIVE_INT_FIELDS + ("num_kv_blocks",))
def test_positive_int_accepted(field):
    assert getattr(EngineConfig(**{field: 1}), field) == 1


@pytest.mark.parametrize("value", [0.0, -0.1, 1.0001, 1.5])
def test_gpu_memory_utilization_out_of_range(value):
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        EngineConfig(gpu_memory_utilization=value)


@pytest.mark.parametrize("value", [1e-3, 0.5, 1.0])
def test_gpu_memory_utilization_in_range(value):
    assert EngineConfig(gpu_memory_utilization=value).gpu_memory_utilization == value


@pytest.mark.parametrize("value", [0, -1.0])
def test_cpu_kv_cache_gib_must_be_positive(value):
    with pytest.raises(ValueError, match="cpu_kv_cache_gib"):
        EngineConfig(cpu_kv_cache_gib=value)


@pytest.mark.parametrize("value", [1.0, "0", None])
def test_seed_must_be_int(value):
    with pytest.raises(ValueError, match="seed"):
        EngineConfig(seed=value)


def test_frozen():
    config = EngineConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_model_len = 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.dtype = "float32"
    assert config.max_model_len == 4096


def test_from_dict_builds_equal_config():
    values = {"dtype": "float32", "device": "cpu", "max_model_len": 128, "num_kv_blocks": 7}
    assert EngineConfig.from_dict(values) == EngineConfig(**values)


def test_from_dict_unknown_key_names_it():
    with pytest.raises(ValueError, match="max_model_length") as info:
        EngineConfig.from_dict({"max_model_length": 128, "dtype": "float32"})
    # Only the unknown key is reported as unknown; valid keys are listed to help.
    message = str(info.value)
    assert "unknown" in message
    assert "max_model_len" in message


def test_block_size_left_unset_is_32_tokens_over_an_fp8_cache_else_16():
    assert EngineConfig().block_size == 16
    assert EngineConfig(kv_cache_dtype="fp8").block_size == 32
    assert EngineConfig.from_dict({"kv_cache_dtype": "fp8", "block_size": None}).block_size == 32
    assert EngineConfig(kv_cache_dtype="fp8", block_size=16).block_size == 16  # a choice stays
    assert EngineConfig(block_size=64).block_size == 64
    fp8 = EngineConfig(kv_cache_dtype="fp8")
    assert dataclasses.replace(fp8, max_num_seqs=8).block_size == 32


def test_from_dict_reports_every_unknown_key():
    with pytest.raises(ValueError) as info:
        EngineConfig.from_dict({"zzz": 1, "aaa": 2})
    assert "aaa" in str(info.value) and "zzz" in str(info.value)


def test_from_dict_still_validates_values():
    with pytest.raises(ValueError, match="block_size"):
        EngineConfig.from_dict({"block_size": 0})
