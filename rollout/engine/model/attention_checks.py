"""The construction-time forward: what the paged attention function is asked for at run time.

`check_config` (capabilities.py) reads what a config declares; this part catches what only a
forward shows: arguments a family passes to the attention function, layers that never attend or
attend twice, keys and values of another shape than the cache's, a step that cannot be captured
in a CUDA graph. `check_forward` runs one short generation through the engine while it is built,
so any of these refuses the model before it takes a request.
"""

from __future__ import annotations

from typing import Any

import torch

from rollout.engine.model.capabilities import UnsupportedModelError, refusal


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


def check_forward(engine: Any) -> None:
    """Run one short greedy generation (a prefill step and a decode step) through the engine and
    require every decoder layer to have attended through the paged cache. Any failure of this
    forward refuses the model here, before it takes requests."""
    from rollout.engine.execution.cuda_graph import CaptureError
    from rollout.engine.sampling_params import SamplingParams

    num_layers = len(engine.runner.kv_caches)
    forwards = engine.runner.layers_attended = []
    prompt = [min(1, engine.vocab_size - 1)] * 3
    try:
        results = engine.generate([prompt], SamplingParams(max_tokens=2, temperature=0.0))
    except UnsupportedModelError as err:
        raise UnsupportedModelError(refusal(engine.model, [str(err)])) from err
    except CaptureError as err:
        raise UnsupportedModelError(str(err)) from err
    except Exception as err:
        raise UnsupportedModelError(
            refusal(engine.model, [f"a test forward through the paged cache failed: {err!r}"])
        ) from err
    finally:
        engine.runner.layers_attended = None
    if results[0].finish_reason == "error":
        raise UnsupportedModelError(
            refusal(engine.model, [f"a test generation failed: {results[0].error}"])
        )
    for layers in forwards:
        problem = _layer_coverage(layers, num_layers)
        if problem:
            raise UnsupportedModelError(refusal(engine.model, [problem]))


def _layer_coverage(layers: list[int], num_layers: int) -> str | None:
    """Each layer must attend exactly once per forward, and write and read its own cache."""
    missing = sorted(set(range(num_layers)) - set(layers))
    if missing:
        return (
            f"decoder layers {missing} never called the attention function (layers without "
            "attention, e.g. state-space or recurrent ones, keep a state the paged cache does "
            "not hold)"
        )
    twice = sorted({i for i in layers if layers.count(i) > 1})
    if twice:
        return (
            f"decoder layers {twice} call the attention function more than once per forward "
            "(e.g. differential attention); the paged cache holds one key and value per layer"
        )
    return None
