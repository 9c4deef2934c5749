"""The construction-time forward: one short generation that refuses a model the engine cannot
serve exactly, before it takes a request.

`check_config` (model/capabilities.py) reads what a config declares; this forward shows the rest:
arguments a family passes to the attention function (model/attention_checks.py), layers that never
attend or attend twice, keys and values of another shape than the cache's, a step that cannot be
captured in a CUDA graph.
"""

from __future__ import annotations

import time

import torch

from rollout.engine.config import EngineConfig
from rollout.engine.execution.cuda_graph import CaptureError
from rollout.engine.model.capabilities import UnsupportedModelError, refusal
from rollout.engine.sampling_params import SamplingParams
from rollout.engine.scheduling.request_checks import check_prompt
from rollout.engine.scheduling.sequence import Sequence
from rollout.engine.step_loop import OverlapLoop, SyncLoop


def check_forward(
    model: torch.nn.Module,
    loop: SyncLoop | OverlapLoop,
    config: EngineConfig,
    vocab_size: int,
    cache_tokens: int,
) -> None:
    """Run one short greedy generation (a prefill step and a decode step) through `loop` and
    require every decoder layer to have attended through the paged cache. Any failure of this
    forward refuses the model here, before it takes requests.

    The loop is the engine's kind over the engine's runner, with a scheduler and blocks of its
    own: the engine's counters, arrival-order seeds and prefix cache start untouched."""
    runner = loop.runner
    prompt = [min(1, vocab_size - 1)] * 3
    params = SamplingParams(max_tokens=2, temperature=0.0)
    error = check_prompt(
        prompt,
        params,
        vocab_size=vocab_size,
        max_model_len=config.max_model_len,
        max_num_seqs=config.max_num_seqs,
        cache_tokens=cache_tokens,
    )
    if error is not None:
        raise UnsupportedModelError(refusal(model, [f"a test generation failed: {error}"]))
    loop.scheduler.add(
        Sequence(
            seq_id=0,
            request_id="forward-check",
            index=0,
            params=params,
            seed=0,
            sample_index=0,
            prompt_token_ids=prompt,
            arrival=0,
            arrival_time=time.monotonic(),
        )
    )
    forwards = runner.layers_attended = []
    try:
        while loop.scheduler.has_unfinished() or loop.has_in_flight():
            loop.step()
    except UnsupportedModelError as err:
        raise UnsupportedModelError(refusal(model, [str(err)])) from err
    except CaptureError as err:
        raise UnsupportedModelError(str(err)) from err
    except Exception as err:
        raise UnsupportedModelError(
            refusal(model, [f"a test forward through the paged cache failed: {err!r}"])
        ) from err
    finally:
        runner.layers_attended = None
    for layers in forwards:
        problem = _layer_coverage(layers, len(runner.kv_caches))
        if problem:
            raise UnsupportedModelError(refusal(model, [problem]))


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
