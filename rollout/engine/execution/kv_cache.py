"""The paged KV cache tensors: shape from the model config, size from memory or the config.

With `kv_cache_dtype="fp8"` each layer's keys and values are e4m3 with a power-of-two scale per
(token, KV head) beside them (`torch_fp8.quantize_kv`): 2 x (head_dim + 4) bytes a token and
head instead of 2 x 2 x head_dim, so the same memory holds 1.9x the tokens at head_dim 128.
Its V pages (of up to 128 tokens, a power of two) are laid out by token
(`torch_paged_attention.v_by_token`), which lets the decode and extend kernels widen V's tiles
in the MMA's operand layout; its K pages and its scales are laid out head by head
(`keys_by_head`, `scales_by_head`), so a page's keys of one KV head are one run of bytes and a
tile's scales a few adjacent ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from rollout.engine.config import EngineConfig
from rollout.kernels.tiling import lays_out_v_by_token
from rollout.kernels.torch_fp8 import FP8_DTYPE


class LayerKV(NamedTuple):
    """One layer's paged cache: k and v [num_blocks, block_size, num_kv_heads, head_dim], and
    with an FP8 cache their scales [num_blocks, block_size, num_kv_heads] (fp32), else None."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None


def kv_dtype(config: EngineConfig, model_dtype: torch.dtype) -> torch.dtype:
    return FP8_DTYPE if config.kv_cache_dtype == "fp8" else model_dtype


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
        """K and V of every layer for one block (their scales too, for an FP8 cache)."""
        element = torch.empty((), dtype=dtype).element_size()
        per_head = self.head_dim * element + (4 if dtype == FP8_DTYPE else 0)
        return 2 * self.num_layers * block_size * self.num_kv_heads * per_head


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
    sequences. `dtype`: the cache's (kv_dtype)."""
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
) -> list[LayerKV]:
    """One tensor for all layers' K and V (and one for their FP8 scales); per layer views of
    [num_blocks, block_size, num_kv_heads, head_dim] (an FP8 cache's V laid out by token in
    memory, [num_blocks, num_kv_heads, head_dim, block_size], where its pages are of up to 128
    tokens, a power of two: `lays_out_v_by_token`; there its K is laid out head by head,
    [num_blocks, num_kv_heads, block_size, head_dim], and so are its scales: `keys_by_head`,
    `scales_by_head`)."""
    dims = (num_blocks, block_size, shape.num_kv_heads)
    storage = torch.zeros(shape.num_layers, 2, *dims, shape.head_dim, dtype=dtype, device=device)
    if dtype != FP8_DTYPE:
        return [LayerKV(storage[i, 0], storage[i, 1]) for i in range(shape.num_layers)]
    # The scales head by head in memory, seen as [num_blocks, block_size, num_kv_heads]
    # (`scales_by_head`).
    by_head = (num_blocks, shape.num_kv_heads, block_size)
    scales = torch.ones(shape.num_layers, 2, *by_head, dtype=torch.float32, device=device)
    scales = scales.permute(0, 1, 2, 4, 3)
    by_token = (num_blocks, shape.num_kv_heads, shape.head_dim, block_size)
    keys_by_head = (num_blocks, shape.num_kv_heads, block_size, shape.head_dim)

    def keys(i: int) -> torch.Tensor:
        if not lays_out_v_by_token(block_size):  # pages the kernels read by dim
            return storage[i, 0]
        return storage[i, 0].view(keys_by_head).permute(0, 2, 1, 3)

    def values(i: int) -> torch.Tensor:
        if not lays_out_v_by_token(block_size):
            return storage[i, 1]
        return storage[i, 1].view(by_token).permute(0, 3, 1, 2)

    return [
        LayerKV(keys(i), values(i), scales[i, 0], scales[i, 1]) for i in range(shape.num_layers)
    ]
