"""The memory-bandwidth floor of a decode workload.

A decode step reads every weight once (the embedding table only by row) plus the KV cache of every
running sequence, so its time is at least (weight bytes + KV bytes) / bandwidth. Summing over the
steps of a workload whose B sequences all run P prompt + N new tokens gives the best possible
tokens/s. A sliding-window layer reads at most its window of each context. For an MoE model
`roofline_tokens_per_s` counts every expert (a decode batch of a few dozen rows routes to nearly
all of them); `per_step_floor` counts only the experts a step's tokens are expected to touch, which
is what a small batch (the tail of an RL rollout) reads. The default bandwidth is the device-copy
bandwidth (read + write) of one NVIDIA H200; docs/performance.md, 'The two numbers', has the
figure and the rooflines it gives. On another GPU the benchmarks divide by that GPU's own copy
bandwidth, measured when they start (`floor_bandwidth`).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from rollout.engine.model.fp8_weights import fp8_read_bytes_saved

H200_COPY_BANDWIDTH = 4.24e12  # bytes/s: one H200's device copy, read + write
_H200_FIGURE = (H200_COPY_BANDWIDTH, "one H200's copy bandwidth")


def floor_bandwidth(device) -> tuple[float, str]:
    """(bytes/s, what it is) the floors of a run on `device` divide by: H200_COPY_BANDWIDTH on
    an H200 (every H200 report's figure, so they stay comparable) and off CUDA (where no floor
    is reported); on any other GPU its own device-copy bandwidth, measured once per process."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return _H200_FIGURE
    name = torch.cuda.get_device_name(device)
    if "H200" in name:
        return _H200_FIGURE
    index = device.index if device.index is not None else torch.cuda.current_device()
    return measured_copy_bandwidth(index), f"{name}'s copy bandwidth, measured"


@functools.cache
def measured_copy_bandwidth(device_index: int, nbytes: int = 1 << 28, copies: int = 10) -> float:
    """Bytes read and written a second by a device-to-device copy of `nbytes` (well past any
    L2) on the GPU, the median of `copies` timed ones: how H200_COPY_BANDWIDTH was measured."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device_index}")
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    seconds = []
    for _ in range(copies):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        seconds.append(start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / sorted(seconds)[len(seconds) // 2]


def weight_bytes_per_step(model) -> int:
    """Bytes of weights one decode step reads: all parameters but the input embedding table
    (unless it is tied to the output head, which reads it whole); the weights an FP8 engine
    reads as FP8 count one byte each, plus their scales."""
    embedding = model.get_input_embeddings().weight
    total = 0
    seen = set()
    for p in model.parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        total += p.numel() * p.element_size()
    tied = model.get_output_embeddings() is not None and (
        model.get_output_embeddings().weight.data_ptr() == embedding.data_ptr()
    )
    total -= sum(fp8_read_bytes_saved(model))
    return total if tied else total - embedding.numel() * embedding.element_size()


def engine_kv_bytes_per_token(engine) -> int:
    """Bytes of K and V one token takes in `engine`'s cache, all layers (an FP8 cache's scales
    included): what a decode step reads per context token."""
    runner = engine.debug_internals().runner
    return runner.shape.bytes_per_block(1, runner.kv_caches[0].k.dtype)


def roofline_tokens_per_s(
    weight_bytes: int,
    kv_per_token: int,
    num_seqs: int,
    prompt_len: int,
    new_tokens: int,
    bandwidth: float = H200_COPY_BANDWIDTH,
    windows: tuple[int | None, ...] | None = None,
) -> float:
    """Best tokens/s for num_seqs sequences decoding new_tokens each after prompt_len.
    `windows`: each layer's sliding window (None: full attention); `kv_per_token` covers all
    layers, so each layer's share is kv_per_token / len(windows)."""
    if windows is None or all(w is None for w in windows):
        # Step i reads the KV of num_seqs contexts of prompt_len + i tokens; sum in closed form.
        kv_tokens = num_seqs * (new_tokens * prompt_len + new_tokens * (new_tokens - 1) / 2)
    else:
        contexts = range(prompt_len, prompt_len + new_tokens)
        per_layer = [sum(c if w is None else min(c, w) for c in contexts) for w in windows]
        kv_tokens = num_seqs * sum(per_layer) / len(windows)
    seconds = (new_tokens * weight_bytes + kv_tokens * kv_per_token) / bandwidth
    return num_seqs * new_tokens / seconds


class WeightSplit(NamedTuple):
    """A model's per-step weight bytes split into what every step reads and the MoE experts."""

    dense_bytes: int
    """Everything but the experts, counted as `weight_bytes_per_step` counts it."""
    expert_bytes: int
    """All experts of all MoE layers (0 for a dense model)."""
    num_experts: int
    """Experts per MoE layer (0 for a dense model)."""
    top_k: int
    """Experts each token is routed to, per MoE layer (0 for a dense model)."""


def weight_split(model) -> WeightSplit:
    """Split `weight_bytes_per_step(model)` into non-expert and expert bytes. An experts module is
    one holding 3-D `gate_up_proj` and `down_proj` parameters of its own: transformers 5 stores
    an MoE layer's experts as [num_experts, ...] tensors; every parameter of that module (biases
    too) belongs to the experts."""
    experts = [m for m in model.modules() if _is_experts_module(m)]
    total = weight_bytes_per_step(model)
    if not experts:
        return WeightSplit(total, 0, 0, 0)
    config = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    num_experts = getattr(text, "num_experts", None) or getattr(text, "num_local_experts", None)
    top_k = getattr(text, "num_experts_per_tok", None)
    if not num_experts or not top_k:
        raise ValueError(
            f"{type(model).__name__} has experts modules but its config gives no "
            "num_experts/num_local_experts or num_experts_per_tok"
        )
    expert_bytes = 0
    seen = set()
    for module in experts:
        if module.gate_up_proj.shape[0] != num_experts:
            raise ValueError(
                f"experts tensor of {module.gate_up_proj.shape[0]} experts; config says {num_experts}"
            )
        for p in module.parameters():
            if p.data_ptr() not in seen:
                seen.add(p.data_ptr())
                expert_bytes += p.numel() * p.element_size()
    expert_bytes -= fp8_read_bytes_saved(model)[1]
    return WeightSplit(total - expert_bytes, expert_bytes, int(num_experts), int(top_k))


def _is_experts_module(module) -> bool:
    own = dict(module.named_parameters(recurse=False))
    return all(name in own and own[name].dim() == 3 for name in ("gate_up_proj", "down_proj"))


def expected_touched_experts(num_experts: int, top_k: int, num_tokens: int) -> float:
    """Distinct experts one MoE layer reads for `num_tokens` tokens, as the expectation under
    uniform routing (each token picks top_k distinct experts, all choices equally likely and
    independent between tokens): a given expert escapes one token with probability 1 - k/E, so
    E * (1 - (1 - k/E)^B) are touched. Real routers are skewed, which touches fewer."""
    if num_tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** num_tokens)


def running_per_step(output_lens: Sequence[int]) -> np.ndarray:
    """How many samples decode at step s = 0 .. max_len - 1 when all start together: those with
    more than s new tokens."""
    lengths = np.asarray(output_lens, dtype=np.int64)
    if lengths.size == 0:
        return np.zeros(0, dtype=np.int64)
    ended_by = np.cumsum(np.bincount(lengths, minlength=int(lengths.max()) + 1))  # length <= s
    return lengths.size - ended_by[: int(lengths.max())]


def per_step_floor(
    prompt_lens: int | Sequence[int],
    output_lens: Sequence[int],
    dense_bytes: int,
    kv_per_token: int,
    windows: tuple[int | None, ...] | None = None,
    expert_bytes: int = 0,
    num_experts: int = 0,
    top_k: int = 0,
    bandwidth: float = H200_COPY_BANDWIDTH,
) -> tuple[np.ndarray, float]:
    """The bandwidth floor of each decode step of samples of unequal lengths that all start
    decoding together (sample i: prompt_lens[i] prompt tokens, or one prompt length for all, and
    output_lens[i] new tokens). Returns (seconds of step s for s = 0 .. max_len - 1, their sum).

    Step s runs the samples with more than s new tokens (`running_per_step`). It reads the
    non-expert weights once; for an MoE model (num_experts > 0) the experts its B running tokens
    touch in each layer, `expected_touched_experts` (the uniform-routing expectation) of them, at
    expert_bytes / num_experts each; and each running sample's live KV, a context of P + s
    tokens, or min(P + s, window) in a windowed layer (`windows`: each layer's window, None for
    full attention; `kv_per_token` covers all layers, each layer's share is 1 / len(windows)).
    With equal lengths, a dense model and every expert counted, the sum is the time behind
    `roofline_tokens_per_s`."""
    lengths = np.asarray(output_lens, dtype=np.int64)
    prompts = np.broadcast_to(np.asarray(prompt_lens, dtype=np.int64), lengths.shape)
    # Longest first: the samples running at step s are then a prefix of the arrays.
    order = np.argsort(-lengths, kind="stable")
    prompts = prompts[order]
    running = running_per_step(lengths)
    layer_windows = Counter(windows if windows else (None,))
    num_layers = sum(layer_windows.values())
    kv_tokens = np.zeros(len(running))
    for s, n in enumerate(running.tolist()):
        contexts = prompts[:n] + s
        kv_tokens[s] = (
            sum(
                count * (contexts.sum() if w is None else np.minimum(contexts, w).sum())
                for w, count in layer_windows.items()
            )
            / num_layers
        )
    step_bytes = dense_bytes + kv_tokens * kv_per_token
    if num_experts:
        touched = np.array([expected_touched_experts(num_experts, top_k, n) for n in running])
        step_bytes = step_bytes + expert_bytes * touched / num_experts
    seconds = step_bytes / bandwidth
    return seconds, float(seconds.sum())


def engine_step_floor(
    model, engine, prompt_lens: int | Sequence[int], output_lens: Sequence[int]
) -> tuple[np.ndarray, float]:
    """`per_step_floor` for `model` as `engine` serves it: its weights (touched experts only for
    MoE), the element size of its KV cache and its layers' windows, at the bandwidth of the
    engine's device (`floor_bandwidth`)."""
    split = weight_split(model)
    from rollout.engine.model.capabilities import layer_windows

    kv_per_token = engine_kv_bytes_per_token(engine)
    return per_step_floor(
        prompt_lens,
        output_lens,
        split.dense_bytes,
        kv_per_token,
        windows=layer_windows(engine.model),
        expert_bytes=split.expert_bytes,
        num_experts=split.num_experts,
        top_k=split.top_k,
        bandwidth=floor_bandwidth(engine.device)[0],
    )
