"""MoE routing replay (`trainer.routing_replay: true`): the trainer's forward routes each token to
the experts the rollout chose for it.

The rollout and the trainer choose experts independently, and near ties (bf16, other kernels)
send a token to other experts in training than in the rollout: its logprob is then another
policy's. The engine records the rollout's choices (`EngineConfig.record_routes`); here each
router of the trainer's model takes them instead of its own top-k, while its routing weights are
still the softmax of its own logits at the replayed experts (renormalized as the router does),
so the router keeps its gradient. Where a token has no recorded route (padding, a sample's last
token, which the rollout never fed), the router chooses as usual.

The routes enter as a keyword argument of the model's forward, `routed_experts` ([batch, seq,
num_routers, top_k] int32, -1 for no route: a type every collective broadcasts, as a
multi-rank batch is), which transformers hands to every decoder layer; a
pre-hook on each MoE decoder layer takes it for that layer's router. Passed that way, the routes
are part of the layer's call, so gradient checkpointing's recompute replays them too. A forward
without the argument routes as the model always does (the parity probe, the reference model).
"""

from __future__ import annotations

import types

import numpy as np
import torch
import torch.nn.functional as F

from rollout.engine.model.fused_routing import router_code
from rollout.engine.model.route_recording import model_routers, no_route
from trainers.trl_adapter import across_ranks

ROUTES_KWARG = "routed_experts"


def trainer_routes(routes: np.ndarray) -> np.ndarray:
    """A sample's recorded routes (kept in the engine's compact dtype until a batch is laid out)
    in the trainer's form: int32, -1 for 'no route'."""
    out = routes.astype(np.int32)
    out[routes == no_route(routes.dtype)] = -1
    return out


def own_routes(model: torch.nn.Module, input_ids: torch.Tensor) -> np.ndarray:
    """[tokens, num_routers, top_k]: the experts the model's own routers choose in a plain
    forward over one sequence's `input_ids` (no routes replayed; for comparing with recorded
    ones)."""
    chosen = []
    hooks = [
        router.register_forward_hook(lambda m, args, out: chosen.append(out[2].cpu()))
        for router in model_routers(model)
    ]
    try:
        with torch.no_grad():
            model(input_ids=input_ids.reshape(1, -1), logits_to_keep=1)  # the routes, not logits
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack(chosen, dim=1).numpy()


def replay_kwargs(routes: np.ndarray | None, length: int, device) -> dict:
    """The forward's keyword argument for one sequence of `length` tokens with its recorded
    `routes` (the tokens past them route themselves); {} without routes."""
    if routes is None:
        return {}
    full = np.full((length, *routes.shape[1:]), -1, dtype=np.int32)
    known = trainer_routes(routes)[:length]
    full[: len(known)] = known
    return {ROUTES_KWARG: torch.from_numpy(full)[None].to(device)}


class RouteReplay:
    """Installed once on the trainer's model (before FSDP or PEFT wrap it: the modules stay)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.routers = model_routers(model)  # the engine records them in this order
        self.top_k = self.routers[0].top_k
        self.current: torch.Tensor | None = None  # [tokens, num_routers, top_k] of this layer call
        self.counts: torch.Tensor | None = None  # (replayed, flipped) routes, on the device
        for ordinal, router in enumerate(self.routers):
            router.forward = types.MethodType(_replaying_forward(self, ordinal), router)
        for layer in _decoder_layers(model, self.routers):
            layer.register_forward_pre_hook(self._take_routes, with_kwargs=True)

    def _take_routes(self, module, args, kwargs):
        routes = kwargs.pop(ROUTES_KWARG, None)
        self.current = None if routes is None else routes.reshape(-1, *routes.shape[-2:])
        return args, kwargs

    def take_counts(self) -> dict[str, float]:
        """Since the last call: the share of replayed (token, layer) routes on which the
        trainer's own top-k would have chosen other experts, over every rank's tokens (each rank
        calls this after each of its forwards)."""
        counts = self.counts
        if counts is None:  # still takes part in the sum over ranks
            counts = torch.zeros(2, dtype=torch.int64, device=self.routers[0].weight.device)
        self.counts = None
        replayed, flipped = across_ranks.summed(counts).tolist()
        if replayed == 0:
            return {}
        return {"routing/flipped_fraction": flipped / replayed}


def _replaying_forward(replay: RouteReplay, ordinal: int):
    def forward(self, hidden_states):
        routes = replay.current
        if routes is None:
            return type(self).forward(self, hidden_states)
        code = router_code(self)
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        if routes.shape[0] != hidden_states.shape[0]:
            raise ValueError(
                f"routing replay: {routes.shape[0]} tokens of routes for a forward of "
                f"{hidden_states.shape[0]} tokens (the routes must match the batch's layout)"
            )
        logits = F.linear(hidden_states, self.weight)
        probs = F.softmax(logits, dtype=torch.float, dim=-1)
        _, own = torch.topk(probs, self.top_k, dim=-1)
        recorded = routes[:, ordinal].to(device=own.device, dtype=torch.long)
        missing = (recorded < 0).any(dim=-1, keepdim=True)
        index = torch.where(missing, own, recorded)
        weights = probs.gather(1, index)
        if code.renormalize_attr is None or getattr(self, code.renormalize_attr):
            weights = weights / weights.sum(dim=-1, keepdim=True)
        if code.cast_to_logits_dtype:
            weights = weights.to(logits.dtype)
        with torch.no_grad():
            kept = ~missing[:, 0]
            differs = (index.sort(dim=-1).values != own.sort(dim=-1).values).any(dim=-1)
            counts = torch.stack([kept.sum(), (differs & kept).sum()])
            replay.counts = counts if replay.counts is None else replay.counts + counts
        return logits, weights, index

    return forward


def _decoder_layers(model: torch.nn.Module, routers: list) -> list[torch.nn.Module]:
    """The decoder layer holding each router (the module transformers hands the forward's
    keyword arguments to, and the unit gradient checkpointing recomputes)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    name_of = {id(m): name for name, m in model.named_modules()}
    modules = dict(model.named_modules())
    layers = {}
    for router in routers:
        name = name_of[id(router)]
        parts = name.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            candidate = modules[".".join(parts[:cut])]
            if isinstance(candidate, GradientCheckpointingLayer):
                layers[id(candidate)] = candidate
                break
        else:
            raise ValueError(f"routing replay: no decoder layer holds the router {name}")
    return list(layers.values())
