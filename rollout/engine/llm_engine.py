"""LLMEngine: requests in, completions out; one engine per device."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from collections.abc import Sequence as SequenceABC
from typing import Any, NamedTuple

import torch

from rollout.engine.assembly import assemble
from rollout.engine.config import EngineConfig
from rollout.engine.execution.device_timing import DeviceTiming
from rollout.engine.execution.model_runner import ModelRunner
from rollout.engine.model.loader import (
    load_model,
    load_tokenizer,
    model_folder,
    resolve_device,
    resolve_dtype,
)
from rollout.engine.sampling_params import SamplingParams
from rollout.engine.scheduling.block_manager import BlockManager
from rollout.engine.scheduling.request_checks import check_prompt
from rollout.engine.scheduling.scheduler import Scheduler
from rollout.engine.scheduling.sequence import Completion, Sequence
from rollout.engine.seeds import request_seed
from rollout.engine.stats import EngineStats, collect_stats, reset_counters
from rollout.engine.step_loop import OverlapLoop, SyncLoop
from rollout.engine.weight_update import (
    NamedTensors,
    NonFiniteWeightsError,
    name_some,
    update_weights,
)

Prompt = str | list[int]


class EngineInternals(NamedTuple):
    """What `LLMEngine.debug_internals()` returns."""

    scheduler: Scheduler
    block_manager: BlockManager
    runner: ModelRunner
    loop: SyncLoop | OverlapLoop


class LLMEngine:
    """Continuous-batching generation over a transformers causal LM with a paged KV cache.

    >>> engine = LLMEngine(EngineConfig(model="path/to/model"))
    >>> engine.generate(["2 + 2 ="], SamplingParams(max_tokens=8, temperature=0))
    """

    def __init__(self, config: EngineConfig) -> None:
        if not config.model:
            raise ValueError(
                'EngineConfig.model is empty: give a model folder, or "smollm2" for the built-in'
            )
        device = resolve_device(config.device)
        dtype = resolve_dtype(config.dtype, device)
        folder = model_folder(config.model)
        model = load_model(folder, dtype, device, config.load_format)
        self._setup(model, config, load_tokenizer(folder), device, dtype)

    @classmethod
    def from_model(cls, model: torch.nn.Module, config: EngineConfig, tokenizer=None) -> LLMEngine:
        """Wrap an in-memory transformers model (moved to the config's device and dtype in place,
        and put in eval mode). Outside the engine's steps the model still runs its own attention,
        so `model(ids)` gives the same logits as before it was wrapped; with
        weight_quantization="fp8" its weights are rounded to their FP8 values in place (pass a
        copy to keep the original)."""
        engine = cls.__new__(cls)
        device = resolve_device(config.device)
        dtype = resolve_dtype(config.dtype, device)
        model.to(device=device, dtype=dtype)
        engine._setup(model, config, tokenizer, device, dtype)
        return engine

    def _setup(self, model, config: EngineConfig, tokenizer, device, dtype) -> None:
        parts = assemble(model, config, tokenizer, device, dtype)
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.dtype = dtype
        self.vocab_size = parts.vocab_size
        self.num_kv_blocks = parts.num_kv_blocks
        self._runner = parts.runner
        self._block_manager = parts.block_manager
        self._scheduler = parts.scheduler
        self._step_loop = parts.step_loop
        self._ready: list[Completion] = []  # results known without running (bad requests, aborts)
        self._refused_weights: str | None = None  # why the weights cannot run (update_weights)
        self._arrivals = itertools.count()
        self._request_ids = itertools.count()

    # ---- low-level API: add requests, step, collect ---------------------------------------------

    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams,
        request_id: str | None = None,
        first_index: int = 0,
    ) -> str:
        """Queue one prompt's `params.n` samples (indices first_index .. first_index + n - 1)."""
        request_id = request_id if request_id is not None else f"req-{next(self._request_ids)}"
        token_ids = self._tokenize(prompt)
        arrival = next(self._arrivals)
        seed = params.seed if params.seed is not None else request_seed(self.config.seed, arrival)
        error = check_prompt(
            token_ids,
            params,
            vocab_size=self.vocab_size,
            max_model_len=self.config.max_model_len,
            max_num_seqs=self.config.max_num_seqs,
            cache_tokens=self.num_kv_blocks * self.config.block_size,
            has_tokenizer=self.tokenizer is not None,
        )
        if error is not None:
            for j in range(params.n):
                self._ready.append(
                    Completion(first_index + j, list(token_ids), [], [], "error", error, request_id)
                )
            return request_id
        seq = Sequence(
            seq_id=arrival,
            request_id=request_id,
            index=first_index,
            params=params,
            seed=seed,
            sample_index=0,
            prompt_token_ids=list(token_ids),
            arrival=arrival,
            arrival_time=time.monotonic(),
            num_forks_pending=params.n - 1,
        )
        self._scheduler.add(seq)
        return request_id

    def abort(self, request_id: str) -> None:
        """End every sample of the request with finish_reason "abort" (returned by the next step)."""
        for seq in self._scheduler.abort(request_id):
            self._ready.append(seq.to_completion())

    def has_unfinished(self) -> bool:
        return (
            bool(self._ready) or self._scheduler.has_unfinished() or self._step_loop.has_in_flight()
        )

    def step(self) -> list[Completion]:
        """Run one step; returns the completions that ended since the last call. Raises
        RuntimeError while the weights hold values an update_weights refused (NaN or inf);
        the requests wait for an update with finite ones."""
        self._raise_if_weights_refused()
        finished = (
            self._step_loop.step()
            if (self._scheduler.has_unfinished() or self._step_loop.has_in_flight())
            else []
        )
        ready, self._ready = self._ready, []
        return ready + [seq.to_completion() for seq in finished]

    # ---- weights, stats -------------------------------------------------------------------------

    def _raise_if_weights_refused(self) -> None:
        if self._refused_weights is not None:
            raise RuntimeError(
                f"the engine's weights hold NaN or inf ({self._refused_weights}) since an "
                "update_weights refused them; call update_weights with finite weights first"
            )

    def update_weights(self, weights: NamedTensors | Callable[[torch.nn.Module], Any]) -> Any:
        """Copy new weights into the model in place, between steps (from the thread that steps
        the engine): (name, tensor) pairs, named as in `model.named_parameters()`, or a function
        that copies into the model's parameters itself (returns what it returns). The copies are
        ordered after any step still on the device, and the prefix cache is emptied first, so no
        later request reuses KV computed with the old weights. Weights that hold NaN or inf
        raise NonFiniteWeightsError (pairs before anything is copied; a function's after it
        wrote them, and then the engine runs no step until an update with finite weights)."""
        fp8 = self._runner.prepared.fp8_weights
        try:
            result = update_weights(
                self.model,
                self._runner.streams,
                self.reset_prefix_cache,
                weights,
                after=fp8.round_all if fp8 is not None else None,
            )
        except NonFiniteWeightsError as err:
            if callable(weights):  # written into the model: no step may run on them
                self._refused_weights = name_some(err.names)
            raise
        self._refused_weights = None
        return result

    @property
    def fp8_weights(self):
        """The FP8 weights' copies (`fp8_weights.Fp8Weights`), or None without FP8."""
        return self._runner.prepared.fp8_weights

    def output_lengths(self) -> dict[str, dict[int, int]]:
        """Tokens each unfinished sample has generated so far, by request id and sample index
        (a token still being computed on the device counts: its step was launched before
        anything the caller does now). Read at a weight update, it says how many of each
        sample's tokens came from the weights before it."""
        lengths: dict[str, dict[int, int]] = {}
        for seq in (*self._scheduler.running, *self._scheduler.waiting):
            lengths.setdefault(seq.request_id, {})[seq.index] = seq.num_output_tokens
        return lengths

    def reset_prefix_cache(self) -> None:
        """Forget the cached KV of finished requests (`update_weights` does it); call it if the
        model's weights change any other way, or later requests would reuse stale KV."""
        self._scheduler.reset_prefix_cache()

    def stats(self) -> EngineStats:
        """A snapshot of the engine's sequences, KV blocks and counters (see EngineStats)."""
        return collect_stats(
            self._scheduler, self._block_manager, self._runner, self._step_loop.num_steps
        )

    def reset_stats(self) -> None:
        """Count steps, preemptions, prefix-cache hits, speculation and device time from zero."""
        reset_counters(self._scheduler, self._runner)
        self._step_loop.num_steps = 0

    def measure_device_time(self) -> None:
        """Time each step's compute on the device from now on (CUDA events, or host clocks on
        CPU), reported as `stats().device_s`. Off by default: it adds two events a step."""
        if self._runner.timing is None:
            self._runner.timing = DeviceTiming(self.device)

    def debug_internals(self) -> EngineInternals:
        """The engine's parts, for tests and benchmarks that look inside a step (the running
        sequences, the CUDA graphs) or steer a part directly. Not a stable interface: code that
        serves or trains uses the request API, `stats()` and `update_weights()`."""
        return EngineInternals(self._scheduler, self._block_manager, self._runner, self._step_loop)

    # ---- high-level API -----------------------------------------------------------------------

    def generate(
        self,
        prompts: SequenceABC[Prompt],
        params: SamplingParams | SequenceABC[SamplingParams],
        use_tqdm: bool = False,
    ) -> list[Completion]:
        """All completions in input order: prompt i's samples at [offset_i, offset_i + n_i)."""
        total = _count_samples(prompts, params)
        results: list[Completion | None] = [None] * total
        progress = _progress(total, use_tqdm)
        for completion in self.stream(prompts, params):
            results[completion.index] = completion
            progress.update(1)
        progress.close()
        assert all(r is not None for r in results), "every sample ends with exactly one result"
        return results  # type: ignore[return-value]

    def stream(
        self,
        prompts: SequenceABC[Prompt],
        params: SamplingParams | SequenceABC[SamplingParams],
    ) -> Iterator[Completion]:
        """Yield completions as they finish (any order); `index` gives their place in the input."""
        self._raise_if_weights_refused()  # before any request is queued
        if self.has_unfinished():
            raise RuntimeError(
                "engine has requests in flight; generate()/stream() need an idle engine "
                "(use add_request()/step() to mix)"
            )
        params_list = _params_per_prompt(prompts, params)
        offset = 0
        for prompt, sp in zip(prompts, params_list, strict=True):
            self.add_request(prompt, sp, first_index=offset)
            offset += sp.n
        while self.has_unfinished():
            yield from self.step()

    # ---- helpers ------------------------------------------------------------------------------

    def _tokenize(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError(
                    "prompt is a string but the engine has no tokenizer; pass token ids"
                )
            return self.tokenizer.encode(prompt, add_special_tokens=True)
        return list(prompt)


def _params_per_prompt(prompts, params) -> list[SamplingParams]:
    if isinstance(params, SamplingParams):
        return [params] * len(prompts)
    params = list(params)
    if len(params) != len(prompts):
        raise ValueError(
            f"got {len(prompts)} prompts but {len(params)} SamplingParams; give one or one per prompt"
        )
    return params


def _count_samples(prompts, params) -> int:
    return sum(p.n for p in _params_per_prompt(prompts, params))


def _progress(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="generating", unit="seq", disable=not enabled)
