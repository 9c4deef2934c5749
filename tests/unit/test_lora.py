"""LoRA: the target modules checked against the model before any work (trainers/job), and the
PEFT side (trainers/trl_adapter/lora.py): its config, the adapters a weight sync sends, and the
merged final model, each compared with what PEFT itself computes."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tests.conftest import tiny_model
from trainers.job.config_loading import load_config
from trainers.job.config_trainer import LoraSettings

_LLAMA_LINEAR = "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"


# ---- preflight: the targets name linear layers of the model ---------------------------------


def _preflight_refusal(policy_dir: str, overrides: list[str]) -> str:
    from trainers.job.preflight import JobInputError, _lora_targets

    config = load_config(None, [f"model={policy_dir}", "trainer.lora.r=4", *overrides])
    with pytest.raises(JobInputError) as caught:
        _lora_targets(config, policy_dir)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_targets_that_exist_pass(policy_dir) -> None:
    from trainers.job.preflight import _lora_targets

    _lora_targets(load_config(None, []), policy_dir)  # LoRA off: nothing to check
    for targets in (
        "all-linear",
        "[q_proj, v_proj]",
        "[mlp.down_proj]",
        "[model.layers.0.mlp.up_proj]",
    ):
        overrides = ["trainer.lora.r=4", f"trainer.lora.target_modules={targets}"]
        _lora_targets(load_config(None, overrides), policy_dir)


def test_a_target_that_names_no_linear_layer_is_refused_naming_the_layers(policy_dir) -> None:
    message = _preflight_refusal(policy_dir, ["trainer.lora.target_modules=[q_proj, foo, mlp]"])
    assert message == (
        f"trainer.lora.target_modules: [foo, mlp] matches no linear layer of {policy_dir}; its "
        f"linear layers end in {_LLAMA_LINEAR}"
    )
    # A part of a name is not a suffix of it: PEFT would not match "proj" either.
    message = _preflight_refusal(policy_dir, ["trainer.lora.target_modules=[proj]"])
    assert message.startswith("trainer.lora.target_modules: [proj] matches no linear layer")


class _HeadNamedOutput(nn.Module):
    """A model whose output head is not called lm_head, and one with no other linear layer."""

    def __init__(self, with_body: bool) -> None:
        super().__init__()
        self.body = nn.Linear(4, 4) if with_body else nn.Identity()
        self.output = nn.Linear(4, 8)

    def get_output_embeddings(self) -> nn.Module:
        return self.output


def test_the_models_own_output_head_is_refused() -> None:
    from trainers.job.lora_targets import lora_target_problem

    settings = LoraSettings(r=4, target_modules=("body", "output"))
    assert lora_target_problem(settings, _HeadNamedOutput(True), "m") == (
        "trainer.lora.target_modules: [output] names output, the output head of m: TRL's "
        "AsyncGRPO computes logprobs from its base weight and would ignore the adapter; "
        "leave it out"
    )
    assert lora_target_problem(LoraSettings(r=4), _HeadNamedOutput(True), "m") is None
    assert lora_target_problem(LoraSettings(r=4), _HeadNamedOutput(False), "m") == (
        "trainer.lora.target_modules=all-linear: m has no linear layer besides its output head; "
        "list the modules to adapt"
    )


def test_the_model_is_built_without_its_weights(policy_dir) -> None:
    from trainers.job.lora_targets import meta_model

    model = meta_model(policy_dir)
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert type(model).__name__ == "LlamaForCausalLM"


# ---- the PEFT side ---------------------------------------------------------------------------


def test_peft_config_for_the_job_settings() -> None:
    from peft import TaskType

    from trainers.trl_adapter.lora import peft_config_for

    config = peft_config_for(LoraSettings(r=8, dropout=0.1, target_modules=("q_proj", "v_proj")))
    assert (config.task_type, config.r, config.lora_alpha) == (TaskType.CAUSAL_LM, 8, 16)
    assert (config.lora_dropout, config.bias) == (0.1, "none")
    assert set(config.target_modules) == {"q_proj", "v_proj"}
    assert peft_config_for(LoraSettings(r=4, alpha=2)).target_modules == "all-linear"
    assert peft_config_for(LoraSettings(r=4, alpha=2)).lora_alpha == 2


def _peft_llama(settings: LoraSettings):
    """A tiny Llama with LoRA, its B matrices random (PEFT starts them at zero, a no-op)."""
    from peft import get_peft_model

    from trainers.trl_adapter.lora import peft_config_for

    model = get_peft_model(tiny_model("llama", seed=3), peft_config_for(settings))
    torch.manual_seed(4)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.1)
    return model


def test_adapter_for_sync_gives_what_peft_merges() -> None:
    from trainers.trl_adapter.lora import adapter_for_sync

    model = _peft_llama(LoraSettings(r=4, alpha=12, target_modules=("q_proj", "down_proj")))
    layers = adapter_for_sync(model)
    names = [name for name, *_ in layers]
    assert names == [
        f"model.layers.{i}.{part}"
        for i in range(2)
        for part in ("self_attn.q_proj", "mlp.down_proj")
    ]
    merged = copy.deepcopy(model).merge_and_unload()  # the plain transformers model
    merged_modules = dict(merged.named_modules())
    for name, lora_a, lora_b, scaling in layers:
        base = model.get_submodule("base_model.model." + name).base_layer.weight
        assert lora_a.shape == (4, base.shape[1]) and lora_b.shape == (base.shape[0], 4)
        assert scaling == 3.0 and not lora_a.requires_grad and not lora_b.requires_grad
        expected = merged_modules[name].weight
        torch.testing.assert_close(base + scaling * lora_b @ lora_a, expected, atol=1e-6, rtol=0)
        assert not torch.equal(expected, base)  # the adapter changed the weight


def test_adapter_for_sync_gathers_fsdp2_shards(tmp_path) -> None:
    """One CPU rank under FSDP2: the adapter weights are DTensors and come back whole."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from trainers.trl_adapter.lora import adapter_for_sync

    model = _peft_llama(LoraSettings(r=2, target_modules=("v_proj",)))
    plain = adapter_for_sync(model)
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        for layer in model.base_model.model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        assert any(isinstance(p, DTensor) for p in model.parameters())
        sharded = adapter_for_sync(model)
    finally:
        dist.destroy_process_group()
    assert [s[0] for s in sharded] == [p[0] for p in plain]
    for (_, a, b, scaling), (_, a_plain, b_plain, scaling_plain) in zip(
        sharded, plain, strict=True
    ):
        assert type(a) is torch.Tensor and type(b) is torch.Tensor
        assert torch.equal(a, a_plain) and torch.equal(b, b_plain) and scaling == scaling_plain


def test_save_merged_model_writes_a_model_transformers_loads(tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    from trainers.trl_adapter.lora import save_merged_model

    tiny_model("llama", seed=3).save_pretrained(tmp_path / "base")
    model = _peft_llama(LoraSettings(r=4))
    model.save_pretrained(tmp_path / "adapter")
    expected = copy.deepcopy(model).merge_and_unload().state_dict()

    save_merged_model(tmp_path / "adapter", tmp_path / "base", tmp_path / "merged", torch.float32)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not any("lora" in key for key in loaded.state_dict())
    assert loaded.state_dict().keys() == expected.keys()
    for key, value in loaded.state_dict().items():
        torch.testing.assert_close(value, expected[key], atol=1e-6, rtol=0)
