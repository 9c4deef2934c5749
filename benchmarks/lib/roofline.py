"""The memory-bandwidth floor of a decode workload.

A decode step reads every weight once (the embedding table only by row) plus the KV cache of every
running sequence, so its time is at least (weight bytes + KV bytes) / bandwidth. Summing over the
steps of a workload whose B sequences all run P prompt + N new tokens gives the best possible
tokens/s. A sliding-window layer reads at most its window of each context. For an MoE model every
expert counts: a decode batch of a few dozen rows routes to nearly all of them. The default bandwidth is the device-copy bandwidth (read + write) of one NVIDIA H200;
docs/performance.md, 'The two numbers', has the figure and the rooflines it gives.
"""

from __future__ import annotations

H200_COPY_BANDWIDTH = 4.24e12  # bytes/s: one H200's device copy, read + write


def weight_bytes_per_step(model) -> int:
    """Bytes of weights one decode step reads: all parameters but the input embedding table
    (unless it is tied to the output head, which reads it whole)."""
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
    return total if tied else total - embedding.numel() * embedding.element_size()


def kv_bytes_per_token(model_config, element_size: int) -> int:
    text = (
        model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    )
    heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return 2 * text.num_hidden_layers * heads * head_dim * element_size


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
