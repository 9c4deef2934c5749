"""SamplingParams: validation names the bad field, defaults are valid, stop ids become a tuple."""

from __future__ import annotations

import dataclasses
import re

import pytest

from rollout.engine.sampling_params import SamplingParams


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 0),
        ("max_tokens", -3),
        ("max_tokens", 2.0),
        ("temperature", -1),
        ("temperature", -1e-6),
        ("temperature", float("nan")),
        ("temperature", "1.0"),
        ("top_p", 0),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_p", -0.5),
        ("top_k", -1),
        ("top_k", 2.0),
        ("min_p", 2),
        ("min_p", -0.1),
        ("n", 0),
        ("n", -1),
        ("seed", -1),
        ("seed", 1.5),
        ("stop_token_ids", [-1]),
        ("stop_token_ids", [3, -2]),
        ("stop_token_ids", ["a"]),
        ("stop_token_ids", [1.0]),
        ("stop_token_ids", [5, None]),
    ],
)
def test_invalid_field_raises_value_error_naming_it(field, value):
    with pytest.raises(ValueError, match=re.escape(f"SamplingParams.{field} ")) as info:
        SamplingParams(**{field: value})
    # The message also shows the rejected value.
    assert repr(value) in str(info.value)


def test_defaults_are_valid():
    params = SamplingParams()
    assert params.max_tokens == 16
    assert params.temperature == 1.0
    assert params.top_p == 1.0
    assert params.top_k == 0
    assert params.min_p == 0.0
    assert params.n == 1
    assert params.seed is None
    assert params.stop_token_ids == ()
    assert params.ignore_eos is False
    assert params.greedy is False


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(max_tokens=1),
        dict(temperature=0),
        dict(temperature=0.0),
        dict(temperature=2),
        dict(top_p=1),
        dict(top_p=1e-6),
        dict(top_k=0),
        dict(top_k=50),
        dict(min_p=0),
        dict(min_p=1),
        dict(min_p=0.5),
        dict(n=64),
        dict(seed=0),
        dict(seed=2**40),
        dict(stop_token_ids=[0, 7]),
    ],
)
def test_boundary_values_are_accepted(kwargs):
    params = SamplingParams(**kwargs)
    for name, value in kwargs.items():
        got = getattr(params, name)
        assert got == (tuple(value) if isinstance(value, list) else value)


def test_stop_token_ids_list_becomes_tuple():
    params = SamplingParams(stop_token_ids=[3, 9, 3])
    assert params.stop_token_ids == (3, 9, 3)
    assert isinstance(params.stop_token_ids, tuple)
    # Hashable (frozen dataclass with a tuple field).
    assert hash(params) == hash(SamplingParams(stop_token_ids=(3, 9, 3)))


def test_stop_token_ids_from_generator_becomes_tuple():
    params = SamplingParams(stop_token_ids=(i for i in range(3)))
    assert params.stop_token_ids == (0, 1, 2)


@pytest.mark.parametrize(
    ("temperature", "greedy"), [(0, True), (0.0, True), (1e-6, False), (1.0, False)]
)
def test_greedy_property(temperature, greedy):
    assert SamplingParams(temperature=temperature).greedy is greedy


def test_frozen():
    params = SamplingParams()
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.temperature = 0.5
