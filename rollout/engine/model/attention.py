"""Our paged attention, plugged into transformers' own model classes by name.

Registering through `AttentionInterface` keeps the model code untouched (the trainer runs the very
same modules, so weights sync by name and logprobs agree). No mask function is registered on
purpose: for an attention name that the mask registry does not know, transformers builds no mask
at all and skips its packed-sequence detection (which would read a device value on the host every
forward, a sync that defeats the overlap loop and breaks CUDA-graph capture). The paged kernels
mask by sequence lengths.

The model runs our attention only inside an engine step (`paged_attention_selected`): outside
one, its config names its own implementation again, so a model wrapped by an engine still runs
`model(ids)` exactly as before (masks included).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch._dynamo

from rollout.engine.model.attention_checks import check_attention_call, check_window
from rollout.engine.model.forward_context import get_forward_context
from rollout.engine.model.implementation_switch import implementation_selected

ATTENTION_NAME = "rollout_paged"


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,  # [1, num_heads, num_tokens, head_dim]
    key: torch.Tensor,  # [1, num_kv_heads, num_tokens, head_dim]
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: torch.Tensor | None = None,  # [num_heads] sink logits (gpt-oss)
    **kwargs,
) -> tuple[torch.Tensor, None]:
    ctx = get_forward_context()
    # The q/k norms' and rotary's op wrote this layer's keys and values already (fused_qk_rope)
    kv_written = kwargs.pop("kv_written", False)
    k_cache, v_cache, k_scale, v_scale = ctx.kv_caches[module.layer_idx]
    q = query[0].transpose(0, 1)  # [num_tokens, num_heads, head_dim]
    k = key[0].transpose(0, 1)  # [num_tokens, num_kv_heads, head_dim]
    v = value[0].transpose(0, 1)
    # Host-side checks only: cheap per layer, and inside CUDA graphs they run once, at capture.
    check_attention_call(module, k, v, k_cache, attention_mask, dropout, kwargs)
    window = ctx.windows[module.layer_idx]
    check_window(module, sliding_window, window)
    if ctx.layers_attended is not None:
        ctx.layers_attended.append(module.layer_idx)
    if not kv_written:
        ctx.backend.write_kv(k, v, k_cache, v_cache, ctx.meta.slot_mapping, k_scale, v_scale)
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    out = ctx.backend.attend(
        q, k_cache, v_cache, ctx.meta, scale, window=window, softcap=softcap, sinks=s_aux,
        kv_scales=(k_scale, v_scale) if k_scale is not None else None,
    )  # fmt: skip
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


@contextmanager
def paged_attention_selected(model: torch.nn.Module) -> Iterator[None]:
    """Inside: the model's attention is ours (and no mask is built). The attention modules and
    the mask code read `config._attn_implementation` at each call, so setting it is enough; on
    the way out the model's own implementation comes back."""
    with implementation_selected(_attention_configs(model), "_attn_implementation", ATTENTION_NAME):
        yield


def _attention_configs(model: torch.nn.Module) -> list:
    config = model.config
    configs = [config]
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if text is not config:
        configs.append(text)
    return configs
