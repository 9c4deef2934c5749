"""The experts each token was routed to, recorded in every MoE layer of an engine step.

A rollout's tokens depend on which experts its routers chose; the trainer's forward chooses
again, and near ties (bf16, other kernels) choose differently. With `EngineConfig.record_routes`
the engine keeps each fed token's top-k expert indices per MoE layer, so the trainer can replay
them (trainers/trl_adapter/routing_replay.py). The routes of a token are one row
[num_routers, top_k] in a compact dtype: uint8 when a layer has at most 255 experts, else int16.

Only the softmax routers of `fused_routing.ROUTER_CODE` are recorded (their replay must
recompute their weights exactly); an MoE model with any other router is refused. Each router
writes its indices into one device buffer [max_tokens, num_routers, top_k] inside the step (CUDA
graphs capture the write like any other op); the runner copies the step's rows out with its
sampled tokens.
"""

from __future__ import annotations

import types

import numpy as np
import torch

from rollout.engine.model.fused_experts import experts_modules
from rollout.engine.model.fused_routing import ROUTER_CODE, router_code


def model_routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's MoE routers in module order (the order of a route row's entries). Raises a
    ValueError that says why when the model's routes cannot be recorded and replayed."""
    routers = [m for m in model.modules() if router_code(m) is not None]
    experts = experts_modules(model)
    known = sorted(name.rsplit(".", 1)[-1] for name in ROUTER_CODE)
    if not routers:
        raise ValueError(
            f"routes are recorded for MoE models with softmax top-k routers ({', '.join(known)}); "
            f"{type(model).__name__} has none. Turn record_routes / trainer.routing_replay off"
        )
    if experts and len(experts) != len(routers):
        raise ValueError(
            f"{type(model).__name__} has {len(experts)} MoE layers but only {len(routers)} of "
            f"them route with a router whose choices can be replayed ({', '.join(known)}); "
            "turn record_routes / trainer.routing_replay off"
        )
    shapes = {(r.num_experts, r.top_k) for r in routers}
    if len(shapes) != 1:
        raise ValueError(f"MoE layers with different expert counts or top-k: {sorted(shapes)}")
    return routers


def route_dtype(num_experts: int) -> np.dtype:
    return np.dtype(np.uint8) if num_experts <= 255 else np.dtype(np.int16)


def no_route(dtype: np.dtype) -> int:
    """The value that marks 'no recorded route' (the model routes that token itself)."""
    return 255 if np.dtype(dtype) == np.uint8 else -1


class RouteRecorder:
    """Each router's forward, writing its chosen experts into the step's route buffer."""

    def __init__(
        self, model: torch.nn.Module, max_tokens: int, device: torch.device, inner: dict
    ) -> None:
        """`inner`: id(router) -> the forward it runs inside a step when not its own (the fused
        routing kernel's)."""
        self.routers = model_routers(model)
        self.num_routers = len(self.routers)
        self.top_k = self.routers[0].top_k
        self.dtype = route_dtype(self.routers[0].num_experts)
        torch_dtype = torch.uint8 if self.dtype == np.uint8 else torch.int16
        self.buffer = torch.zeros(
            max_tokens, self.num_routers, self.top_k, dtype=torch_dtype, device=device
        )
        # Made once: a compiled decoder layer sees the same bound method every step.
        self.forwards = [
            (router, types.MethodType(_recording_forward(self, i, inner.get(id(router))), router))
            for i, router in enumerate(self.routers)
        ]


def _recording_forward(recorder: RouteRecorder, ordinal: int, inner):
    def forward(self, hidden_states):
        if inner is not None:
            logits, weights, index = inner(hidden_states)
        else:
            logits, weights, index = type(self).forward(self, hidden_states)
        recorder.buffer[: index.shape[0], ordinal].copy_(index)
        return logits, weights, index

    return forward
