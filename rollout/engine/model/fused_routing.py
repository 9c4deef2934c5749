"""Our one-launch softmax top-k (rollout/kernels/triton_routing.py) in place of a router's own.

transformers' softmax routers (an `nn.Module` per layer, its `forward` returning the logits, the
k weights and the k experts) have no dispatch by name, unlike the attention and the experts.
Inside an engine step, each router of a class whose code we know runs our forward instead: the
same `F.linear` over its own `weight` for the logits, then the routing kernel for what the
router's softmax, top-k, renormalization and cast compute. Outside a step the instance's own
forward is back, so `model(ids)`, the trainer and weight sync see the model unchanged.

Only the classes below are taken, each exactly (a subclass may route differently); any other
router (sigmoid scores, grouped or biased top-k, jitter, a shared-expert gate) keeps its own
code. tests/unit/test_fused_routing.py checks each class's forward against the twin, so a
transformers release that changed one of them fails there first.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class RouterCode:
    """What a router class computes after its logits."""

    renormalize_attr: str | None  # the attribute that says whether to renormalize (None: always)
    cast_to_logits_dtype: bool  # False: the weights stay fp32


ROUTER_CODE = {
    "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeTopKRouter": RouterCode(
        "norm_topk_prob", True
    ),
    "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeTopKRouter": RouterCode(
        "norm_topk_prob", True
    ),
    "transformers.models.olmoe.modeling_olmoe.OlmoeTopKRouter": RouterCode("norm_topk_prob", True),
    "transformers.models.mixtral.modeling_mixtral.MixtralTopKRouter": RouterCode(None, False),
}


def router_code(module: torch.nn.Module) -> RouterCode | None:
    cls = type(module)
    return ROUTER_CODE.get(f"{cls.__module__}.{cls.__qualname__}")


def _renormalize(module: torch.nn.Module, code: RouterCode) -> bool:
    return True if code.renormalize_attr is None else bool(getattr(module, code.renormalize_attr))


def fused_router_forward(
    self: torch.nn.Module, hidden_states: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(router logits, top-k weights, top-k experts), as the router's own forward returns them."""
    from rollout.kernels import triton_routing
    from rollout.kernels.torch_moe import top_k_routing_reference

    code = router_code(self)
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    logits = F.linear(hidden_states, self.weight)
    renormalize = _renormalize(self, code)
    dtype = logits.dtype if code.cast_to_logits_dtype else torch.float32
    if triton_routing.supported(logits, self.top_k):
        weights, index = triton_routing.top_k_routing(logits, self.top_k, renormalize, dtype)
    else:
        weights, index = top_k_routing_reference(logits, self.top_k, renormalize, dtype)
    return logits, weights, index


def select_fused_routers(model: torch.nn.Module) -> list[tuple[torch.nn.Module, object]]:
    """(router, the forward to give it inside a step) for every router of a known class. The
    bound methods are made once: a compiled layer then sees the same object every step."""
    return [
        (m, types.MethodType(fused_router_forward, m))
        for m in model.modules()
        if router_code(m) is not None and "forward" not in vars(m)  # nobody else's override
    ]


@contextmanager
def fused_routers_selected(routers: list[tuple[torch.nn.Module, object]]) -> Iterator[None]:
    """Inside: these routers run our forward; after, their own again."""
    for module, forward in routers:
        module.forward = forward
    try:
        yield
    finally:
        for module, _ in routers:
            del module.forward
