"""The trainer arguments the job hands to TRL: named as the installed transformers names them."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

pytest.importorskip("trl")


def test_checkpointing_goes_by_the_installed_name_without_a_deprecation_warning(tmp_path) -> None:
    from transformers import TrainingArguments
    from trl import GRPOConfig

    from trainers.trl_adapter.args import _checkpointing_by_its_name

    args = {"output_dir": str(tmp_path), "gradient_checkpointing": True, "use_cpu": True}
    renamed = _checkpointing_by_its_name(args)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        config = GRPOConfig(**renamed)
    assert config.gradient_checkpointing is True  # the old name still reads the setting
    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    if "activation_checkpointing" in fields:
        assert "gradient_checkpointing" not in renamed and config.activation_checkpointing is True
    else:
        assert renamed == args
