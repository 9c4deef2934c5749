"""An engine's parts, built for one model and config and checked together before the first
request: the KV cache sized from what the device has left (the FP8 copies still to be made
counted), the model runner, the scheduler over its block manager, and the step loop. A test
forward runs through all of them first (`forward_check`), on a scheduler and block manager of
its own, so the engine's own start from a clean cache and clean counters."""

from __future__ import annotations

from typing import NamedTuple

import torch

from rollout.engine.config import EngineConfig
from rollout.engine.execution.kv_cache import KVCacheShape, decide_num_blocks, kv_dtype
from rollout.engine.execution.model_runner import ModelRunner
from rollout.engine.forward_check import check_forward
from rollout.engine.model.capabilities import check_config
from rollout.engine.model.fp8_weights import fp8_bytes_needed
from rollout.engine.model.loader import eos_token_ids_of
from rollout.engine.model.route_recording import model_routers
from rollout.engine.scheduling.block_manager import BlockManager
from rollout.engine.scheduling.scheduler import Scheduler
from rollout.engine.step_loop import OverlapLoop, SyncLoop
from rollout.engine.stop_strings import StopStrings


class EngineParts(NamedTuple):
    vocab_size: int
    num_kv_blocks: int
    runner: ModelRunner
    block_manager: BlockManager
    scheduler: Scheduler
    step_loop: SyncLoop | OverlapLoop


def assemble(
    model: torch.nn.Module, config: EngineConfig, tokenizer, device, dtype: torch.dtype
) -> EngineParts:
    """The parts of an engine over `model` (already on `device`, in `dtype`); raises, saying
    what to change, for a model or config the engine cannot serve."""
    check_config(model)  # before any memory is allocated for it
    if config.record_routes:
        model_routers(model)  # raises, saying why, when its routes cannot be recorded
    model.eval()
    vocab_size = model.get_input_embeddings().weight.shape[0]
    shape = KVCacheShape.from_model_config(model.config)
    pending = (
        fp8_bytes_needed(model, config.fp8_lm_head) if config.weight_quantization == "fp8" else 0
    )
    num_kv_blocks = decide_num_blocks(
        config, shape, kv_dtype(config, dtype), device, vocab_size, pending
    )
    runner = ModelRunner(model, config, device, dtype, num_kv_blocks, vocab_size)
    loop_class = OverlapLoop if config.overlap else SyncLoop
    eos_token_ids = eos_token_ids_of(model, tokenizer)
    stop_string_hit = StopStrings(tokenizer).hit if tokenizer is not None else None

    def new_scheduler(block_manager: BlockManager) -> Scheduler:
        return Scheduler(
            block_manager,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=config.max_model_len,
            eos_token_ids=eos_token_ids,
            speculative_tokens=(
                config.num_speculative_tokens if config.speculative != "none" else 0
            ),
            speculative_max_seqs=config.speculative_max_seqs,
            prefix_caching=config.enable_prefix_caching,
            stop_string_hit=stop_string_hit,
        )

    check_forward(
        model,
        loop_class(
            new_scheduler(BlockManager(num_kv_blocks, config.block_size)),
            runner,
            config.block_size,
        ),
        config,
        vocab_size,
        cache_tokens=num_kv_blocks * config.block_size,
    )
    block_manager = BlockManager(num_kv_blocks, config.block_size)
    scheduler = new_scheduler(block_manager)
    step_loop = loop_class(scheduler, runner, config.block_size)
    return EngineParts(vocab_size, num_kv_blocks, runner, block_manager, scheduler, step_loop)
