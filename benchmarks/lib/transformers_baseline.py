"""transformers' own continuous batching on the same model, for `bench_rollout.py --compare-transformers`.

transformers can run its paged cache with a flash-attention varlen kernel, but that needs the
flash-attn packages, which not every machine can install. torch ships a FlashAttention-2 varlen
kernel of its own (`aten._flash_attention_forward`), so we register it as a transformers attention
function that follows transformers' varlen path (write the new K/V through the paged cache, read
back this batch's K/V, no mask). This is the faster of the options that need no extra package
(`paged|sdpa` is several times slower; docs/performance.md, 'The transformers baseline').
Written against the continuous-batching API of transformers 5.17.
"""

from __future__ import annotations

import math
import time

import torch

VARLEN_NAME = "paged|torch_fa2_varlen"


def _torch_fa2_varlen(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs
):
    cache = kwargs.pop("cache", None) or kwargs.pop("past_key_values", None)
    if cache is None:
        raise ValueError(f"{VARLEN_NAME} runs only inside transformers' continuous batching")
    keys, values = cache.update(
        key_states=key,
        value_states=value,
        layer_idx=module.layer_idx,
        read_index=kwargs["read_index"],
        write_index=kwargs["write_index"],
    )
    cu_q, cu_k = kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"]
    max_q, max_k = kwargs["max_seqlen_q"], kwargs["max_seqlen_k"]
    if isinstance(cu_k, dict):  # hybrid caches: full-attention layers only
        cu_k, max_k = cu_k["full_attention"], max_k["full_attention"]
    q = query.transpose(1, 2).squeeze(0)  # [num_tokens, num_heads, head_dim]
    out = torch.ops.aten._flash_attention_forward(
        q.contiguous(),
        keys.contiguous(),
        values.contiguous(),
        cu_q.to(torch.int32),
        cu_k.to(torch.int32),
        int(max_q),
        int(max_k),
        0.0,
        True,
        False,
        scale=scaling if scaling is not None else module.scaling,
    )[0]
    return out, None


def run_transformers_cb(
    model, prompts: list[list[int]], new_tokens: int, asynchronous: bool, deadline_s: float = 0.0
) -> dict:
    """Generate exactly `new_tokens` per prompt with transformers' continuous batching."""
    from transformers import AttentionInterface, ContinuousBatchingConfig, GenerationConfig

    AttentionInterface.register(VARLEN_NAME, _torch_fa2_varlen)
    model.set_attn_implementation(VARLEN_NAME)
    block_size = 256
    blocks = len(prompts) * math.ceil((len(prompts[0]) + new_tokens + 1) / block_size) + 8
    cb_config = ContinuousBatchingConfig(
        block_size=block_size,
        num_blocks=blocks,
        max_batch_tokens=2048,
        use_async_batching=asynchronous,
        use_cuda_graph=True,
    )
    generation_config = GenerationConfig(
        max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1
    )
    torch.cuda.reset_peak_memory_stats()
    manager = model.init_continuous_batching(
        generation_config=generation_config, continuous_batching_config=cb_config
    )
    manager.warmup()
    torch.cuda.synchronize()
    start = time.perf_counter()
    manager.start()
    ids = manager.add_requests(inputs=prompts, max_new_tokens=new_tokens)
    results = {}
    truncated = False
    while len(results) < len(ids):
        result = manager.get_result(timeout=0.05)
        if result is not None and result.is_finished():
            results[result.request_id] = result
        if deadline_s and time.perf_counter() - start > deadline_s:
            truncated = True
            break
    wall = time.perf_counter() - start
    steps = getattr(manager, "current_batch", None)
    manager.stop(block=True, timeout=120, **({"hard_stop": True} if truncated else {}))
    tokens = sum(len(r.generated_tokens) for r in results.values())
    if truncated:  # finished requests only: count steps as the tokens each running request made
        tokens = len(prompts) * (steps or 0)
    return {
        "mode": f"transformers-{'async' if asynchronous else 'sync'}",
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "steps": steps,
        "ms_per_step": 1e3 * wall / steps if steps else None,
        "truncated_at_deadline": truncated,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
    }
