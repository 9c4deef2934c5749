"""torch.compile for the decoder layers' small ops.

A decode step of an 8B model in transformers' own modules launches many tiny kernels (norms,
rotary, activation, residual adds); fusing them makes a graph-captured step much shorter (see
docs/performance.md, 'torch.compile of the decoder layers'). We compile each decoder layer in
place (`nn.Module.compile` keeps parameter names, so weight sync by name still works) and keep our
paged attention out of the compiled code: dynamo stops at it, runs it eagerly, and resumes after.
Shapes are dynamic (one compile serves every batch size and prefill length); the CUDA graphs
capture the compiled kernels like any others.
"""

from __future__ import annotations

import torch

from rollout.engine.model.loader import decoder_layers


def compile_decoder_layers(model: torch.nn.Module) -> int:
    """Compile every decoder layer of a transformers causal LM in place; returns how many."""
    import torch._dynamo

    # The layers share one forward but differ in small attributes (layer index); let dynamo keep
    # a compiled entry for each instead of falling back to eager after the default 8.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 128)
    layers = decoder_layers(model, setting="compile_model")
    for layer in layers:
        layer.compile(dynamic=True)
    return len(layers)
