"""What the engine can serve exactly, checked when an engine is built; everything else is refused.

A sample computed with other attention than the model asks for is worse than an error for RL (its
tokens and logprobs are silently off-policy), so every feature below is either computed exactly
as transformers computes it or refused with a message that names it and says what to do.

Served:
- causal self-attention through transformers' AttentionInterface, any number of query and
  key/value heads (MHA, GQA, MQA), dense or MoE feed-forward, any rotary variant (it runs in the
  model's own code);
- sliding windows per layer (`sliding_window` with `layer_types`, or `use_sliding_window` and
  `max_window_layers`, or one window for all layers): `layer_windows` reads them from the config
  the way transformers builds its masks, and a window a layer passes must agree;
- attention logit softcapping (`attn_logit_softcapping`, Gemma 2);
- attention sinks (gpt-oss's learned per-head sink logits).

Refused (see REFUSALS): models whose attention bypasses the AttentionInterface, encoder-decoder
and multimodal configs, layers without attention (state-space, linear or recurrent layers),
chunked attention, bidirectional attention, multi-head latent attention (MLA) and any other case
where keys and values differ in head size.

Two stages, both at construction: `check_config` here reads the config and the model class before
any memory is allocated; `rollout.engine.forward_check` then runs one short generation through
the engine, where the attention function refuses any argument it does not compute and every
decoder layer must have called it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

SERVED_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})


class UnsupportedModelError(ValueError):
    """The engine cannot compute what this model asks for; the message says what and why."""


def _field(config, name: str, default: Any = None) -> Any:
    """A config value, or `default` when the config lacks it or refuses to give one globally."""
    try:
        return getattr(config, name, default)
    except Exception:  # noqa: BLE001 - e.g. a per-layer attribute read on a heterogeneous config
        return default


def _same_layers(model, config) -> str | None:
    if config.__dict__.get("_heterogeneity_spec") is not None:
        return (
            f"{type(config).__name__} gives its layers their own settings (per_layer_config); "
            "the paged cache needs one head count and head size for all layers. Not supported"
        )
    return None


def _routes_attention_through_transformers(model, config) -> str | None:
    if not getattr(type(model), "_supports_attention_backend", False):
        return (
            f"{type(model).__name__} computes attention in its own code, not through "
            "transformers' AttentionInterface, so the engine's paged attention cannot replace "
            "it. Use a model class that supports attention backends (most decoder-only families)"
        )
    return None


def _decoder_only(model, config) -> str | None:
    if _field(config, "is_encoder_decoder", False):
        return "encoder-decoder models are not served (config.is_encoder_decoder=True)"
    if _field(config, "add_cross_attention", False):
        return "cross-attention is not served (config.add_cross_attention=True)"
    return None


def _text_only(model, config) -> str | None:
    sub = [
        name
        for name in getattr(type(config), "sub_configs", {}) or {}
        if name != "text_config" and getattr(config, name, None) is not None
    ]
    if sub:
        return (
            f"{type(config).__name__} is a composite (multimodal) config with {sub}; load the "
            "text model's own causal-LM class instead"
        )
    return None


def _attention_in_every_layer(model, config) -> str | None:
    layer_types = _field(config, "layer_types", None)
    if layer_types is None:
        return None
    other = sorted(set(layer_types) - SERVED_LAYER_TYPES)
    if other:
        return (
            f"config.layer_types holds {other}: the paged kernels compute full and "
            "sliding-window attention only (state-space, linear-attention and convolution "
            "layers also keep a state the paged cache does not hold). Not supported"
        )
    return None


def _no_chunked_attention(model, config) -> str | None:
    chunk = _field(config, "attention_chunk_size", None)
    if chunk:
        return f"chunked attention (config.attention_chunk_size={chunk}) is not supported"
    return None


def _causal(model, config) -> str | None:
    if _field(config, "use_bidirectional_attention", False):
        return "bidirectional attention (config.use_bidirectional_attention=True) is not served"
    if _field(config, "is_causal", True) is False:
        return "non-causal attention (config.is_causal=False) is not served"
    return None


def _no_latent_attention(model, config) -> str | None:
    rank = _field(config, "kv_lora_rank", None)
    if rank:
        return (
            f"multi-head latent attention (MLA, config.kv_lora_rank={rank}) is not supported: "
            "its cache is a compressed latent and its "
            "key and value head sizes differ, while the engine's paged cache holds full keys and "
            "values of one head size. Use a model with standard multi-head or grouped-query "
            "attention"
        )
    return None


def _one_head_size(model, config) -> str | None:
    head_dim = _field(config, "head_dim", None)
    for field in ("v_head_dim", "value_head_dim"):
        v_dim = _field(config, field, None)
        if v_dim is not None and head_dim is not None and v_dim != head_dim:
            return (
                f"keys and values of different head sizes (config.head_dim={head_dim}, "
                f"config.{field}={v_dim}) are not supported by the paged cache"
            )
    return None


REFUSALS: list[Callable[[Any, Any], str | None]] = [
    _same_layers,
    _routes_attention_through_transformers,
    _decoder_only,
    _text_only,
    _attention_in_every_layer,
    _no_chunked_attention,
    _causal,
    _no_latent_attention,
    _one_head_size,
]


def check_config(model: torch.nn.Module) -> None:
    """Raise UnsupportedModelError naming every unsupported feature the config declares."""
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    problems = []
    for check in REFUSALS:
        message = check(model, config) or (check(model, text) if text is not config else None)
        if message and message not in problems:
            problems.append(message)
    if problems:
        raise UnsupportedModelError(refusal(model, problems))


def layer_windows(model: torch.nn.Module) -> tuple[int | None, ...]:
    """The sliding window of each decoder layer (None: full attention), as transformers' masks
    apply it: `layer_types` names the windowed layers; without them, a config `sliding_window`
    covers every layer. The mask, not the attention call, is what transformers' own attention
    (eager, SDPA) obeys: some families pass no window to the attention function at all."""
    config = (
        model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    )
    num_layers = config.num_hidden_layers
    window = _field(config, "sliding_window")
    if window is None or _field(config, "use_sliding_window", True) is False:
        return (None,) * num_layers
    layer_types = _field(config, "layer_types")
    if layer_types is None:
        return (window,) * num_layers
    return tuple(window if t == "sliding_attention" else None for t in layer_types)


def refusal(model: torch.nn.Module, problems: list[str]) -> str:
    """The one message a refusal gives: the model class, every problem, where to read more."""
    return (
        f"the engine cannot serve {type(model).__name__} exactly: "
        + "; ".join(problems)
        + ". See docs/models.md for what is supported."
    )
