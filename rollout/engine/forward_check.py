"""The construction-time forward: one short generation that refuses a model the engine cannot
serve exactly, before it takes a request.

`check_config` (model/capabilities.py) reads what a config declares; this forward shows the rest:
arguments a family passes to the attention function (model/attention_checks.py), layers that never
attend or attend twice, keys and values of another shape than the cache's, a step that cannot be
captured in a CUDA graph.
"""

from __future__ import annotations

from typing import Any

from rollout.engine.model.capabilities import UnsupportedModelError, refusal


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
