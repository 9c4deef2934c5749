"""Runs one step on the device: copy inputs in, carry tokens over, forward, sample, copy out.

`launch()` only enqueues work and returns; `wait()` is the one host sync per step (the step's
copy-out event). On CPU the streams and events are no-ops and the same code runs eagerly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from rollout.engine.attention import register_paged_attention
from rollout.engine.config import EngineConfig
from rollout.engine.forward_context import AttentionMetadata, ForwardContext, forward_context
from rollout.engine.kv_cache import KVCacheShape, allocate_kv_caches
from rollout.engine.sampler import Sampler, SamplingTensors
from rollout.engine.step_inputs import StepInputs
from rollout.engine.step_slot import StepSlot
from rollout.engine.streams import StepStreams
from rollout.kernels import resolve_attention_backend


@dataclass
class StepHandle:
    """A launched step: which slot holds its outputs and how many rows it samples."""

    step_id: int
    slot: StepSlot
    num_rows: int


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        config: EngineConfig,
        device: torch.device,
        dtype: torch.dtype,
        num_kv_blocks: int,
        vocab_size: int,
    ) -> None:
        self.model = model
        self.config = config
        self.device = device
        self.shape = KVCacheShape.from_model_config(model.config)
        self.kv_caches = allocate_kv_caches(
            self.shape, num_kv_blocks, config.block_size, dtype, device
        )
        self.backend = resolve_attention_backend(config.attention, device)
        self.sampler = Sampler(vocab_size, device)
        self.streams = StepStreams(device)
        max_blocks_per_seq = -(-config.max_model_len // config.block_size)
        self.slots = [
            StepSlot(
                self.streams,
                device,
                config.max_num_batched_tokens,
                config.max_num_seqs,
                max_blocks_per_seq,
            )
            for _ in range(2)
        ]
        name = register_paged_attention()
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(name)
        else:  # older transformers
            model.config._attn_implementation = name

    def launch(self, step_id: int, inputs: StepInputs) -> StepHandle:
        slot = self.slots[step_id % 2]
        previous = self.slots[(step_id - 1) % 2]  # its sampled tokens feed our placeholders
        shapes = slot.fill_host(inputs)
        streams = self.streams
        with streams.on(streams.copy_in):
            dev = slot.copy_to_device(shapes)
            slot.copy_in_done.record()
        with streams.on(streams.compute), torch.inference_mode():
            streams.wait(streams.compute, slot.copy_in_done)
            self._copy_blocks(dev["block_copies"])
            carry_src = dev["carry_src"]
            # Carry-over: placeholder positions take the previous step's sampled token.
            input_ids = torch.where(
                carry_src >= 0, previous.tokens_device[carry_src.clamp(min=0)], dev["input_ids"]
            )
            meta = AttentionMetadata(
                slot_mapping=dev["slot_mapping"],
                block_tables=dev["block_tables"],
                query_start_loc=dev["query_start_loc"],
                seq_lens=dev["seq_lens"],
                query_start_loc_host=inputs.query_start_loc.tolist(),
                seq_lens_host=inputs.seq_lens.tolist(),
                max_query_len=int(np.diff(inputs.query_start_loc).max()),
                max_seq_len=int(inputs.seq_lens.max()),
            )
            with forward_context(ForwardContext(meta, self.kv_caches, self.backend)):
                logits = self.model(
                    input_ids=input_ids[None],
                    position_ids=dev["positions"][None],
                    use_cache=False,
                    logits_to_keep=dev["logits_indices"],
                ).logits[0]  # [num_logits, vocab]
            params = SamplingTensors(
                temperature=dev["temperature"],
                top_k=dev["top_k"],
                top_p=dev["top_p"],
                min_p=dev["min_p"],
                keys=dev["keys"],
                needs_sort=inputs.needs_sort,
                needs_min_p=inputs.needs_min_p,
            )
            num_rows = inputs.num_rows
            if num_rows:
                tokens, logprobs = self.sampler(logits[dev["row_logits"]], params)
                slot.tokens_device[:num_rows].copy_(tokens)
                slot.logprobs_device[:num_rows].copy_(logprobs)
            slot.compute_done.record()
        with streams.on(streams.copy_out):
            streams.wait(streams.copy_out, slot.compute_done)
            slot.tokens_host[:num_rows].copy_(slot.tokens_device[:num_rows], non_blocking=True)
            slot.logprobs_host[:num_rows].copy_(slot.logprobs_device[:num_rows], non_blocking=True)
            slot.copy_out_done.record()
        return StepHandle(step_id, slot, num_rows)

    def wait(self, handle: StepHandle) -> tuple[np.ndarray, np.ndarray]:
        """Block until the step's outputs are on the host; returns (token ids, logprobs)."""
        handle.slot.copy_out_done.synchronize()
        n = handle.num_rows
        return handle.slot.tokens_host[:n].numpy().copy(), handle.slot.logprobs_host[
            :n
        ].numpy().copy()

    def _copy_blocks(self, copies: torch.Tensor) -> None:
        """Copy-on-write of shared blocks, in every layer, before this step writes to them."""
        if copies.shape[0] == 0:
            return
        src, dst = copies[:, 0], copies[:, 1]
        for k_cache, v_cache in self.kv_caches:
            k_cache[dst] = k_cache[src]
            v_cache[dst] = v_cache[src]
