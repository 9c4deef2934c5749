"""Benchmark presets: a model shape (random weights built on the device) and a request mix."""

from __future__ import annotations

import math
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
QWEN3_8B = dict(
    arch="qwen3",
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=151936,
    rope_theta=1000000.0,
    max_position_embeddings=40960,
    tie_word_embeddings=False,
)
QWEN3_30B_A3B = dict(  # MoE: 128 experts, 8 per token, in every layer
    arch="qwen3_moe",
    hidden_size=2048,
    intermediate_size=6144,
    moe_intermediate_size=768,
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    num_experts=128,
    num_experts_per_tok=8,
    norm_topk_prob=True,
    decoder_sparse_step=1,
    mlp_only_layers=[],
    vocab_size=151936,
    rope_theta=1000000.0,
    max_position_embeddings=40960,
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

TINY_MOE = dict(
    arch="qwen3_moe",
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=32,
    num_experts=16,
    num_experts_per_tok=4,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
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
    "qwen3-8b": QWEN3_8B,
    "qwen3-30b-a3b": QWEN3_30B_A3B,
    "tiny": TINY,
    "tiny-moe": TINY_MOE,
}

WORKLOADS = {
    "w1": Workload("w1", LLAMA3_8B, 32, 256, 2048),
    "w1-8k": Workload("w1-8k", LLAMA3_8B, 32, 256, 8192),
    "w3": Workload("w3", QWEN25_05B, 256, 256, 1024),
    "long": Workload("long", LLAMA3_8B, 64, 512, 16384),
    "gpt-oss-20b": Workload("gpt-oss-20b", GPT_OSS_20B, 32, 256, 1024),
    "qwen3-30b-a3b": Workload("qwen3-30b-a3b", QWEN3_30B_A3B, 32, 256, 1024),
    "qwen3-30b-a3b-128": Workload("qwen3-30b-a3b-128", QWEN3_30B_A3B, 128, 256, 1024),
    "qwen3-8b-w1": Workload("qwen3-8b-w1", QWEN3_8B, 32, 256, 2048),
    "smoke": Workload("smoke", TINY, 8, 16, 32, device="cpu", dtype="float32"),
    # CPU scaling (bench_scale.py): SmolLM2-135M's shape, long enough to dwarf start-up costs.
    "cpu-135m": Workload("cpu-135m", SMOLLM2_135M, 16, 64, 128, device="cpu", dtype="float32"),
    "gpu-smoke": Workload("gpu-smoke", {**LLAMA3_8B, "num_hidden_layers": 2}, 16, 128, 256),
}


@dataclass(frozen=True)
class GrpoWorkload:
    """An RL-shaped request mix: `num_prompts` prompts, each sampled `group_size` times in one
    request (so a prompt's samples share its KV blocks, as a GRPO rollout's do), every sample of
    a length the workload fixes in advance: a draw from a lognormal clipped to [length_min,
    length_max], rounded. Real rollouts end at EOS with lengths of that heavy-tailed kind: most
    samples finish early and a few long ones keep a small batch decoding for a long tail."""

    name: str
    shape: str  # a key of SHAPES
    num_prompts: int = 16
    group_size: int = 8
    prompt_len: int = 600
    length_median: int = 2048
    length_sigma: float = 1.0
    length_min: int = 256
    length_max: int = 16384
    length_seed: int = 0
    device: str = "cuda"
    dtype: str = "bfloat16"
    engine: dict = field(default_factory=dict)  # EngineConfig overrides

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"unknown shape {self.shape!r}; choose from {sorted(SHAPES)}")
        for name in ("num_prompts", "group_size", "prompt_len", "length_median"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.length_sigma < 0:
            raise ValueError(f"length_sigma must be >= 0, got {self.length_sigma}")
        # A sample's first token is sampled in the step that computes its prompt, where the fork
        # that creates it happens: its own limit can be set only after that, from the 2nd token on.
        if not 2 <= self.length_min <= self.length_max:
            raise ValueError(
                f"need 2 <= length_min <= length_max, got {self.length_min} and {self.length_max}"
            )

    @property
    def model(self) -> dict:
        return SHAPES[self.shape]

    @property
    def num_samples(self) -> int:
        return self.num_prompts * self.group_size

    @property
    def max_model_len(self) -> int:
        return self.prompt_len + self.length_max + 16

    def sample_lengths(self) -> list[int]:
        """Each sample's number of new tokens; prompt i's samples are [i * G, (i + 1) * G)."""
        import numpy as np

        rng = np.random.default_rng(self.length_seed)
        draws = rng.lognormal(math.log(self.length_median), self.length_sigma, self.num_samples)
        return np.clip(np.rint(draws), self.length_min, self.length_max).astype(int).tolist()


# `--workload grpo` and its CPU smoke twin; bench_rollout.py's grpo flags override any field.
GRPO_WORKLOADS = {
    "grpo": GrpoWorkload("grpo", "qwen3-8b"),
    "grpo-smoke": GrpoWorkload(
        "grpo-smoke",
        "tiny",
        num_prompts=4,
        group_size=4,
        prompt_len=16,
        length_median=24,
        length_sigma=0.8,
        length_min=8,
        length_max=64,
        device="cpu",
        dtype="float32",
    ),
}


def model_config(shape: dict):
    """The transformers config of a preset shape (no weights)."""
    from transformers import GptOssConfig, LlamaConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

    shape = dict(shape)
    config_class = {
        "llama": LlamaConfig,
        "qwen2": Qwen2Config,
        "qwen3": Qwen3Config,
        "qwen3_moe": Qwen3MoeConfig,
        "gpt_oss": GptOssConfig,
    }[shape.pop("arch")]
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
