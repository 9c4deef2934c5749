"""A rollout worker's side of weight sync: its membership of the trainer's process group, the
weight version its engine holds, whether a broken transfer left it torn, and the parity probe.

Two kinds of sync come in: full weights, copied into the parameters, and a LoRA adapter's
factors, received into buffers of their own and merged into the base weights (adapter_merge.py).

Its methods that touch the engine run on the worker's loop thread, between steps (the worker
hands them over); `raise_if_torn` and `version` may be read from any thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future

import torch

from rollout.actors.adapter_merge import AdapterMerge
from rollout.engine.llm_engine import LLMEngine
from rollout.engine.sampling_params import SamplingParams
from rollout.engine.scheduling.sequence import Completion
from rollout.engine.weight_update import NonFiniteWeightsError, name_some
from rollout.weight_sync.adapter_manifest import ADAPTER_DTYPE, AdapterManifest, check_adapter
from rollout.weight_sync.group import WeightGroup
from rollout.weight_sync.manifest import WeightManifest, check_manifest
from rollout.weight_sync.transfer import TornWeightsError, receive_into, receive_weights


class WeightReceiver:
    def __init__(self, engine: LLMEngine, worker_id: int) -> None:
        self.engine = engine
        self.worker_id = worker_id
        self.version = 0
        """The weight version the engine holds (0: the weights it was built with)."""
        self.torn = False
        """A sync failed part-way (some parameters are new, some old) or wrote NaN or inf. The
        worker runs no step (and makes no sample with such weights) until a sync succeeds."""
        self._torn_because = ""
        self.group: WeightGroup | None = None
        """This engine's end of the trainer's weight-sync group (None: not joined)."""
        self.adapter = AdapterMerge()
        """The base weights a LoRA adapter is merged into (empty until the first adapter sync)."""
        self._probes: dict[str, Future] = {}

    def join(self, host: str, port: int, rank: int, world_size: int, backend: str) -> None:
        """Join the trainer's weight-sync process group (blocks until every member joined)."""
        if backend in ("nccl", "cuda_ipc"):
            device = self.engine.device
            if device.type != "cuda":
                raise ValueError(
                    f"weight sync over {backend} needs the engine on a GPU; it is on {device}. "
                    "Use gloo"
                )
            # The engine's device may carry no index ("cuda"), which set_device refuses.
            torch.cuda.set_device(
                device.index if device.index is not None else torch.cuda.current_device()
            )
        self.group = WeightGroup(host, port, rank, world_size, backend)

    def check(self, manifest: WeightManifest) -> None:
        """Raise (naming the parameters) if a sync with this manifest would not fit the engine."""
        check_manifest(self.engine.model, manifest)

    def receive(self, manifest: WeightManifest, version: int) -> float:
        """Receive the trainer's broadcast into the engine (on the loop thread, between steps);
        returns the seconds it took."""

        def copy_in(model: torch.nn.Module) -> None:
            # Once any parameter is copied in, the adapter's snapshot is no longer the model's
            # base: a later adapter merges into the new weights, and into torn ones never. A
            # transfer that broke before any copy leaves base and adapter as they were.
            try:
                receive_weights(self.group, manifest, model)
            except TornWeightsError:
                self.adapter.forget_base()
                raise
            self.adapter.forget_base()
            if (fp8 := self.engine.fp8_weights) is not None:  # before they are rounded
                fp8.keep_unrounded()

        return self._apply(copy_in, version)

    def check_adapter(self, manifest: AdapterManifest) -> None:
        """Raise (naming the modules) if an adapter sync with this manifest would not fit."""
        check_adapter(self.engine.model, manifest)
        self.adapter.check(manifest)
        fp8 = self.engine.fp8_weights
        if fp8 is not None and not fp8.keeps_unrounded:
            raise ValueError(
                f"rollout worker {self.worker_id}: a LoRA adapter on FP8 weights needs "
                "EngineConfig(fp8_keep_unrounded=True); merged into the rounded base, updates "
                "smaller than half an e4m3 step would never reach the rollouts"
            )
        if self.torn and not self.adapter.base:
            raise RuntimeError(
                f"rollout worker {self.worker_id}: a full weight sync broke part-way, so there "
                "is no base to merge an adapter into; sync the full weights again first"
            )

    def receive_adapter(self, manifest: AdapterManifest, version: int) -> float:
        """Receive a LoRA adapter's factors and merge them into the engine's weights (on the
        loop thread, between steps); returns the seconds it took."""

        def receive_and_merge(model: torch.nn.Module) -> None:
            self.check_adapter(manifest)  # the pool checked; a direct caller may not have
            factors = {
                name: torch.empty(shape, dtype=ADAPTER_DTYPE, device=self.engine.device)
                for name, shape in zip(manifest.factors.names, manifest.factors.shapes, strict=True)
            }
            try:
                receive_into(self.group, manifest.factors, factors)
            except TornWeightsError as err:  # only our buffers are torn: the model is untouched
                raise RuntimeError(
                    f"the adapter transfer broke; the rollout weights are unchanged: {err}"
                ) from err
            fp8 = self.engine.fp8_weights
            self.adapter.merge(model, manifest, factors, fp8.unrounded if fp8 else None)

        return self._apply(receive_and_merge, version)

    def _apply(self, update: Callable[[torch.nn.Module], None], version: int) -> float:
        """Run `update(model)` through the engine's update_weights and take `version`, or mark
        the engine torn if it broke part-way."""
        if self.group is None:
            raise RuntimeError("join_weight_group() first")
        start = time.perf_counter()
        try:
            self.engine.update_weights(update)
        except BaseException as err:
            # Torn by this transfer, or still torn by an earlier one.
            if isinstance(err, TornWeightsError):
                self.torn = True
                self._torn_because = (
                    "failed part-way, so the engine holds a mix of two weight versions"
                )
            elif isinstance(err, NonFiniteWeightsError):
                self.torn = True
                self._torn_because = f"wrote NaN or inf into {name_some(err.names)}"
            # Leave the group: a trainer still sending to this rank then fails at once instead
            # of waiting out the group's timeout (the pool builds a new group).
            self.group.close()
            self.group = None
            raise
        self.torn = False
        self.version = version
        return time.perf_counter() - start

    def raise_if_torn(self) -> None:
        if self.torn:
            raise RuntimeError(
                f"rollout worker {self.worker_id}: the last weight sync {self._torn_because}; "
                "sync the weights again first"
            )

    # ---- the parity probe: one sampled completion, compared by the trainer with its forward ----

    def add_probe(self, prompt_token_ids: list[int], max_tokens: int, seed: int) -> Future:
        """Queue a probe request among the running ones (on the loop thread); its Completion
        resolves the future."""
        future: Future = Future()
        request_id = f"probe-{len(self._probes)}-{time.monotonic_ns()}"
        params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed)
        self._probes[request_id] = future
        self.engine.add_request(prompt_token_ids, params, request_id=request_id)
        return future

    def claim(self, completion: Completion) -> bool:
        """Resolve the probe this completion ends, if it is one."""
        future = self._probes.pop(completion.request_id, None)
        if future is None:
            return False
        future.set_result(completion)
        return True
