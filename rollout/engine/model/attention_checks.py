"""What the paged attention function is asked for at run time, checked at each eager call.

`check_config` (capabilities.py) reads what a config declares; this part catches what only a
forward shows: arguments a family passes to the attention function, a sliding window other than
the config's, keys and values of another shape than the cache's. The engine's construction-time
forward (`rollout.engine.forward_check`) is where these refuse a model before it takes requests.
"""

from __future__ import annotations

import torch

from rollout.engine.model.capabilities import UnsupportedModelError


def check_window(module: torch.nn.Module, passed: int | None, from_config: int | None) -> None:
    if passed is not None and passed != from_config:
        raise UnsupportedModelError(
            f"layer {getattr(module, 'layer_idx', '?')} asks for a sliding window of {passed} "
            f"tokens where its config gives {from_config}; the engine cannot tell which one "
            "this model's masks apply"
        )


# Arguments transformers passes to an attention function that change nothing the kernels compute
# (output_router_logits: MoE models pass their forward flags down to every module).
_NEUTRAL_ARGUMENTS = frozenset(
    {"position_ids", "use_cache", "cache_position", "output_router_logits"}
)


def check_attention_call(
    module: torch.nn.Module,
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    attention_mask: torch.Tensor | None,
    dropout: float,
    extra: dict,
) -> None:
    """Refuse a call to the paged attention function that asks for anything the kernels do not
    compute (raised during the construction-time forward, where it becomes a refusal)."""
    if (  # the common case, first: it runs for every layer of every eager step
        attention_mask is None
        and not dropout
        and _NEUTRAL_ARGUMENTS.issuperset(extra)
        and getattr(module, "is_causal", True)
        and key.shape[1:] == k_cache.shape[2:] == value.shape[1:]
    ):
        return
    layer = getattr(module, "layer_idx", "?")
    problems = []
    if attention_mask is not None:
        problems.append("the model builds its own attention mask, which the kernels cannot apply")
    if dropout:
        problems.append(f"attention dropout {dropout} (the model is in training mode)")
    if not extra.get("is_causal", getattr(module, "is_causal", True)):
        problems.append("non-causal (bidirectional) attention")
    if extra.get("output_attentions"):
        problems.append("attention weights as an output (output_attentions=True)")
    unknown = sorted(
        name
        for name, v in extra.items()
        if v is not None
        and name not in _NEUTRAL_ARGUMENTS
        and name not in ("is_causal", "output_attentions")
    )
    if unknown:
        problems.append(f"attention arguments the kernels do not compute: {unknown}")
    if key.shape[1:] != k_cache.shape[2:] or value.shape[1:] != k_cache.shape[2:]:
        problems.append(
            f"keys {list(key.shape[1:])} and values {list(value.shape[1:])} (heads, head size) "
            f"of a shape other than the cache's {list(k_cache.shape[2:])}, which was sized from "
            "the config (per-layer head sizes or latent attention)"
        )
    if problems:
        raise UnsupportedModelError(f"layer {layer}: " + "; ".join(problems))
