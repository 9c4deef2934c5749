"""Our paged attention, plugged into transformers' own model classes by name.

Registering through `AttentionInterface` keeps the model code untouched (the trainer runs the very
same modules, so weights sync by name and logprobs agree). No mask function is registered on
purpose: for an attention name that the mask registry does not know, transformers builds no mask
at all and skips its packed-sequence detection (which would read a device value on the host every
forward, a sync that defeats the overlap loop and breaks CUDA-graph capture). The paged kernels
mask by sequence lengths.
"""

from __future__ import annotations

import torch
import torch._dynamo

from rollout.engine.model.forward_context import get_forward_context

ATTENTION_NAME = "rollout_paged"


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, num_heads, num_tokens, head_dim]
    key: torch.Tensor,  # [1, num_kv_heads, num_tokens, head_dim]
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    ctx = get_forward_context()
    if kwargs.get("softcap") is not None or kwargs.get("sliding_window") is not None:
        raise NotImplementedError("paged attention does not support softcap or sliding windows yet")
    k_cache, v_cache = ctx.kv_caches[module.layer_idx]
    q = query[0].transpose(0, 1)  # [num_tokens, num_heads, head_dim]
    k = key[0].transpose(0, 1)  # [num_tokens, num_kv_heads, head_dim]
    v = value[0].transpose(0, 1)
    ctx.backend.write_kv(k, v, k_cache, v_cache, ctx.meta.slot_mapping)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    out = ctx.backend.attend(q, k_cache, v_cache, ctx.meta, scale)
    return out.unsqueeze(0), None  # [1, num_tokens, num_heads, head_dim]


def register_paged_attention() -> str:
    """Register (idempotently) with transformers; returns the attn_implementation name to set."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    # Opaque to torch.compile: dynamo runs it eagerly between compiled pieces (compilation.py).
    AttentionInterface.register(ATTENTION_NAME, torch._dynamo.disable(paged_attention_forward))
    assert ATTENTION_NAME not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping, (
        "see module docstring"
    )
    return ATTENTION_NAME
