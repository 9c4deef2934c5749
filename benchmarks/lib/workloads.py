"""Benchmark presets: a model shape (random weights built on the device) and a request mix."""

from __future__ import annotations

from dataclasses import dataclass, field

LLAMA3_8B = dict(
    arch="llama",
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=128256,
    rope_theta=500000.0,
    tie_word_embeddings=False,
)
QWEN25_05B = dict(
    arch="qwen2",
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
)
QWEN25_15B = dict(
    arch="qwen2",
    hidden_size=1536,
    intermediate_size=8960,
    num_hidden_layers=28,
    num_attention_heads=12,
    num_key_value_heads=2,
    vocab_size=151936,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
)
SMOLLM2_135M = dict(  # the built-in model's shape, for CPU runs
    arch="llama",
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    rope_theta=100000.0,
    tie_word_embeddings=True,
)
GPT_OSS_20B = dict(  # MoE, alternating 128-token windows and full layers, attention sinks
    arch="gpt_oss",
    hidden_size=2880,
    intermediate_size=2880,
    num_hidden_layers=24,
    num_attention_heads=64,
    num_key_value_heads=8,
    head_dim=64,
    num_local_experts=32,
    num_experts_per_tok=4,
    vocab_size=201088,
    sliding_window=128,
    max_position_embeddings=131072,  # what its YaRN rope scaling was set for
    tie_word_embeddings=False,
)
TINY = dict(
    arch="llama",
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)


@dataclass(frozen=True)
class Workload:
    name: str
    model: dict
    num_requests: int
    prompt_len: int
    new_tokens: int
    device: str = "cuda"
    dtype: str = "bfloat16"
    engine: dict = field(default_factory=dict)  # EngineConfig overrides

    @property
    def max_model_len(self) -> int:
        return self.prompt_len + self.new_tokens + 16


SHAPES = {
    "llama-3-8b": LLAMA3_8B,
    "qwen2.5-0.5b": QWEN25_05B,
    "qwen2.5-1.5b": QWEN25_15B,
    "smollm2-135m": SMOLLM2_135M,
    "gpt-oss-20b": GPT_OSS_20B,
    "tiny": TINY,
}

WORKLOADS = {
    "w1": Workload("w1", LLAMA3_8B, 32, 256, 2048),
    "w1-8k": Workload("w1-8k", LLAMA3_8B, 32, 256, 8192),
    "w3": Workload("w3", QWEN25_05B, 256, 256, 1024),
    "long": Workload("long", LLAMA3_8B, 64, 512, 16384),
    "gpt-oss-20b": Workload("gpt-oss-20b", GPT_OSS_20B, 32, 256, 1024),
    "smoke": Workload("smoke", TINY, 8, 16, 32, device="cpu", dtype="float32"),
    # CPU scaling (bench_scale.py): SmolLM2-135M's shape, long enough to dwarf start-up costs.
    "cpu-135m": Workload("cpu-135m", SMOLLM2_135M, 16, 64, 128, device="cpu", dtype="float32"),
    "gpu-smoke": Workload("gpu-smoke", {**LLAMA3_8B, "num_hidden_layers": 2}, 16, 128, 256),
}


def model_config(shape: dict):
    """The transformers config of a preset shape (no weights)."""
    from transformers import GptOssConfig, LlamaConfig, Qwen2Config

    shape = dict(shape)
    config_class = {"llama": LlamaConfig, "qwen2": Qwen2Config, "gpt_oss": GptOssConfig}[
        shape.pop("arch")
    ]
    shape.setdefault("max_position_embeddings", 32768)
    return config_class(**shape, bos_token_id=None, eos_token_id=None)


def write_model_config(shape: dict, folder) -> str:
    """A model folder holding only config.json: engines load it with load_format="dummy"."""
    model_config(shape).save_pretrained(folder)
    return str(folder)


def build_model(shape: dict, dtype: str, device: str):
    """A randomly initialised transformers model of the given shape, created on `device`."""
    import torch
    from transformers import AutoModelForCausalLM

    config = model_config(shape)
    torch_dtype = getattr(torch, dtype)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    return model.eval()
