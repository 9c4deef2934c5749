"""The paged KV cache tensors: shape from the model config, size from memory or the config."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rollout.engine.config import EngineConfig

_GIB = 1 << 30


@dataclass(frozen=True)
class KVCacheShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def from_model_config(cls, model_config) -> KVCacheShape:
        text = (
            model_config.get_text_config()
            if hasattr(model_config, "get_text_config")
            else model_config
        )
        num_heads = text.num_attention_heads
        num_kv_heads = getattr(text, "num_key_value_heads", None) or num_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // num_heads
        return cls(text.num_hidden_layers, num_kv_heads, head_dim)

    def bytes_per_block(self, block_size: int, dtype: torch.dtype) -> int:
        element = torch.empty((), dtype=dtype).element_size()
        return 2 * self.num_layers * block_size * self.num_kv_heads * self.head_dim * element


def decide_num_blocks(
    config: EngineConfig,
    shape: KVCacheShape,
    dtype: torch.dtype,
    device: torch.device,
    vocab_size: int,
    pending_bytes: int = 0,
) -> int:
    """Explicit num_kv_blocks, or what fits: the GPU's memory share minus what is in use, the
    `pending_bytes` the model's preparation will still allocate (FP8 weight copies) and an
    activation reserve (CUDA) or cpu_kv_cache_gib (CPU), capped at max_num_seqs full-length
    sequences."""
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    per_block = shape.bytes_per_block(config.block_size, dtype)
    # More than max_num_seqs full-length sequences can never be used.
    useful = config.max_num_seqs * -(-config.max_model_len // config.block_size)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        in_use = total - free
        # Activations of the largest step, with room for fp32 logits and the sampler's copies.
        reserve = 2 * _GIB + 8 * config.max_num_seqs * vocab_size * 4
        budget = int(total * config.gpu_memory_utilization) - in_use - pending_bytes - reserve
        num_blocks = budget // per_block
        if num_blocks < 1:
            raise RuntimeError(
                f"no GPU memory left for the KV cache (budget {budget / _GIB:.1f} GiB); raise "
                "gpu_memory_utilization, lower max_num_seqs, or set num_kv_blocks"
            )
        return int(min(num_blocks, useful))
    cap = int(config.cpu_kv_cache_gib * _GIB) // per_block
    return max(1, min(useful, cap))


def allocate_kv_caches(
    shape: KVCacheShape, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One tensor for all layers; per layer (k_cache, v_cache) views of
    [num_blocks, block_size, num_kv_heads, head_dim]."""
    storage = torch.zeros(
        shape.num_layers,
        2,
        num_blocks,
        block_size,
        shape.num_kv_heads,
        shape.head_dim,
        dtype=dtype,
        device=device,
    )
    return [(storage[i, 0], storage[i, 1]) for i in range(shape.num_layers)]
