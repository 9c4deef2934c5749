"""Runs one step on the device: copy inputs in, carry tokens over, forward, sample, copy out
(with `record_routes`, the experts each token was routed to come out with the tokens).

`launch()` only enqueues work and returns; `wait()` is the one host sync per step (the step's
copy-out event). On CPU the streams and events are no-ops and the same code runs eagerly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from rollout.engine.config import EngineConfig
from rollout.engine.execution.cuda_graph import (
    SAMPLER_FILTERED,
    SAMPLER_PLAIN,
    DecodeGraphs,
    default_buckets,
    graph_width,
    pad_step_inputs,
)
from rollout.engine.execution.device_timing import DeviceTiming
from rollout.engine.execution.kv_cache import KVCacheShape, allocate_kv_caches, kv_dtype
from rollout.engine.execution.sampler import Sampler, SamplingTensors
from rollout.engine.execution.step_slot import StepSlot
from rollout.engine.execution.streams import StepStreams
from rollout.engine.model.capabilities import layer_windows
from rollout.engine.model.forward_context import ForwardContext, forward_context
from rollout.engine.model.preparation import prepare_model
from rollout.engine.scheduling.step_inputs import StepInputs
from rollout.kernels import resolve_attention_backend
from rollout.kernels.attention_metadata import AttentionMetadata
from rollout.kernels.tiling import EXTEND_BLOCK_M


@dataclass
class StepHandle:
    """A launched step: which slot holds its outputs and how many rows it samples."""

    step_id: int
    slot: StepSlot
    num_rows: int
    num_tokens: int


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
            self.shape, num_kv_blocks, config.block_size, kv_dtype(config, dtype), device
        )
        self.backend = resolve_attention_backend(config.attention, device)
        self.windows = layer_windows(model)
        self.sampler = Sampler(vocab_size, device, use_triton=self.backend.name == "triton")
        self.streams = StepStreams(device)
        max_blocks_per_seq = -(-config.max_model_len // config.block_size)
        self.slots = [
            StepSlot(
                self.streams,
                device,
                config.max_num_batched_tokens,
                config.max_num_seqs,
                max_blocks_per_seq,
                config.max_sampled_rows,
            )
            for _ in range(2)
        ]
        self.graphs: DecodeGraphs | None = None
        # Tokens per sequence of a verification step's graph (1: no speculation).
        self.verify_width = config.num_speculative_tokens + 1 if config.speculative != "none" else 1
        if config.cuda_graphs and device.type == "cuda" and self.backend.name == "triton":
            # The torch twin reads host-side lengths, which a graph cannot refresh: eager there.
            self.graphs = DecodeGraphs(default_buckets(config.max_num_seqs), self.streams.compute)
        self.timing: DeviceTiming | None = None  # device time of each step, once measured
        self.host_wait_s = 0.0  # host time blocked in wait(): the rest of a step is CPU work
        # forward_check.check_forward: the layers that attended, one list per forward.
        self.layers_attended: list[list[int]] | None = None
        self.prepared = prepare_model(model, config, device, self.backend.name)
        recorder = self.prepared.route_recorder
        # One host copy of the route buffer per slot: the copy is enqueued on the compute stream
        # right after the forward, before the next step's forward can overwrite the buffer.
        self.routes_host = (
            [
                torch.zeros_like(recorder.buffer, device="cpu", pin_memory=device.type == "cuda")
                for _ in self.slots
            ]
            if recorder is not None
            else None
        )

    def launch(self, step_id: int, inputs: StepInputs) -> StepHandle:
        """Enqueue one step (copy in, compute, copy out) and return without waiting."""
        slot_index = step_id % 2
        slot = self.slots[slot_index]
        previous = self.slots[(step_id - 1) % 2]  # its sampled tokens feed our placeholders
        num_rows, num_tokens = inputs.num_rows, inputs.num_tokens
        bucket = width = None
        if self.graphs is not None:
            width = graph_width(inputs, self.verify_width)
            if width is not None:
                bucket = self.graphs.bucket_for(inputs.num_seqs)
            if bucket is not None and slot.fits(bucket * width, bucket * width):
                inputs = pad_step_inputs(inputs, bucket, width, slot.max_blocks_per_seq)
            else:
                bucket = None
        shapes = slot.fill_host(inputs)
        streams = self.streams
        with streams.on(streams.copy_in):
            slot.copy_to_device()
            slot.copy_in_done.record()
        with streams.on(streams.compute), torch.inference_mode():
            streams.wait(streams.compute, slot.copy_in_done)
            timing = self.timing.begin() if self.timing is not None else None
            # A graph replays views of the same memory made at capture: it needs none but these.
            self._copy_blocks(slot.device_view("block_copies", shapes["block_copies"]))
            if bucket is None:
                self._forward_and_sample(slot, previous, slot.device_views(shapes), inputs)
            else:
                mode = (
                    SAMPLER_FILTERED if (inputs.needs_sort or inputs.needs_min_p) else SAMPLER_PLAIN
                )
                graph = self.graphs.get(
                    (slot_index, bucket, mode, width),
                    lambda: self._forward_and_sample(
                        slot,
                        previous,
                        self._graph_views(slot, bucket, width),
                        inputs,
                        graph_mode=mode,
                    ),
                )
                graph.replay()
            if self.routes_host is not None:
                self.routes_host[slot_index][:num_tokens].copy_(
                    self.prepared.route_recorder.buffer[:num_tokens], non_blocking=True
                )
            if timing is not None:
                self.timing.end(timing)
            slot.compute_done.record()
        with streams.on(streams.copy_out):
            streams.wait(streams.copy_out, slot.compute_done)
            slot.tokens_host[:num_rows].copy_(slot.tokens_device[:num_rows], non_blocking=True)
            slot.logprobs_host[:num_rows].copy_(slot.logprobs_device[:num_rows], non_blocking=True)
            slot.copy_out_done.record()
        return StepHandle(step_id, slot, num_rows, num_tokens)

    def _forward_and_sample(
        self,
        slot: StepSlot,
        previous: StepSlot,
        dev: dict[str, torch.Tensor],
        inputs: StepInputs,
        graph_mode: str | None = None,
    ) -> None:
        """Carry-over, forward, sample; writes the slot's output buffers. Runs eagerly, or once
        under capture with `graph_mode` set (then only device tensors and static flags are used)."""
        carry_src = dev["carry_src"]
        # Carry-over: placeholder positions take the previous step's sampled token.
        input_ids = torch.where(
            carry_src >= 0, previous.tokens_device[carry_src.clamp(min=0)], dev["input_ids"]
        )
        eager = graph_mode is None
        meta = AttentionMetadata(
            slot_mapping=dev["slot_mapping"],
            block_tables=dev["block_tables"],
            query_start_loc=dev["query_start_loc"],
            seq_lens=dev["seq_lens"],
            q_block_seq=dev["q_block_seq"],
            q_block_start=dev["q_block_start"],
            query_start_loc_host=inputs.query_start_loc.tolist() if eager else None,
            seq_lens_host=inputs.seq_lens.tolist() if eager else None,
            uniform_query_len=inputs.uniform_query_len,
            max_model_len=self.config.max_model_len,
        )
        attended = None
        if self.layers_attended is not None:
            attended = []
            self.layers_attended.append(attended)
        context = ForwardContext(meta, self.kv_caches, self.backend, self.windows, attended)
        with forward_context(context), self.prepared.selected():
            logits = self.model(
                input_ids=input_ids[None],
                position_ids=dev["positions"][None],
                use_cache=False,
                logits_to_keep=dev["logits_indices"],
            ).logits[0]  # [num_logits, vocab]
        filtered = graph_mode == SAMPLER_FILTERED
        params = SamplingTensors(
            temperature=dev["temperature"],
            top_k=dev["top_k"],
            top_p=dev["top_p"],
            min_p=dev["min_p"],
            keys=dev["keys"],
            needs_sort=inputs.needs_sort if eager else filtered,
            needs_min_p=inputs.needs_min_p if eager else filtered,
        )
        num_rows = dev["row_logits"].shape[0]
        if num_rows:
            self.sampler.sample_into(
                logits,
                dev["row_logits"],
                params,
                slot.tokens_device[:num_rows],
                slot.logprobs_device[:num_rows],
            )

    def _graph_views(self, slot: StepSlot, bucket: int, width: int) -> dict[str, torch.Tensor]:
        """Static views of the slot's device buffers for a padded step of `bucket` sequences of
        `width` tokens (the same memory that copy_to_device fills for such a step)."""
        shapes = {name: (bucket * width,) for name in slot.device}  # per token and per row
        shapes["seq_lens"] = (bucket,)
        shapes["query_start_loc"] = (bucket + 1,)
        shapes["block_tables"] = (bucket, slot.max_blocks_per_seq)
        shapes["block_copies"] = (0, 2)
        q_blocks = bucket * -(-width // EXTEND_BLOCK_M)
        shapes["q_block_seq"] = shapes["q_block_start"] = (q_blocks,)
        return {name: slot.device_view(name, shape) for name, shape in shapes.items()}

    def wait(self, handle: StepHandle) -> tuple[np.ndarray, np.ndarray]:
        """Block until the step's outputs are on the host; returns (token ids, logprobs)."""
        start = time.perf_counter()
        handle.slot.copy_out_done.synchronize()
        self.host_wait_s += time.perf_counter() - start
        n = handle.num_rows
        return handle.slot.tokens_host[:n].numpy().copy(), handle.slot.logprobs_host[
            :n
        ].numpy().copy()

    def routes(self, handle: StepHandle) -> np.ndarray | None:
        """The step's routes [num_tokens, num_routers, top_k] once wait() returned (None unless
        the engine records routes). A copy: the slot's buffer is reused two steps later."""
        if self.routes_host is None:
            return None
        return self.routes_host[handle.step_id % 2][: handle.num_tokens].numpy().copy()

    def _copy_blocks(self, copies: torch.Tensor) -> None:
        """Copy-on-write of shared blocks, in every layer, before this step writes to them."""
        if copies.shape[0] == 0:
            return
        src, dst = copies[:, 0], copies[:, 1]
        for layer in self.kv_caches:
            for cache in layer:  # K, V, and an FP8 cache's scales
                if cache is not None:
                    cache[dst] = cache[src]
