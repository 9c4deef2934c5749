"""A Qwen3-family attention's q/k norms and rotary embedding as one op, `rollout::qk_norm_rope`.

Qwen3 normalizes every query and key head (`q_norm`, `k_norm`) before the rotary embedding;
torch.compile made those two kernels a layer, the op makes them one Triton launch on CUDA
(rollout/kernels/triton_qk_rope.py), its twin elsewhere. The fused attention forward
(fused_projections.py) calls it where `route_qk_rope` marked the module: a layer whose norms are
the known classes and whose own norms and rotary, run once on its device, give the twin's values
bit for bit, so a norm of another form under the same class name keeps its module.
"""

from __future__ import annotations

import torch
from torch import nn

# The per-head q/k norms whose forward torch_qk_rope.rms_norm computes (checked numerically too).
_QK_NORM_CLASSES = {"Qwen3RMSNorm", "Qwen3MoeRMSNorm"}


def route_qk_rope(model: nn.Module, enabled: bool) -> int:
    """With `enabled`, mark every fused attention (fused_projections.fuse_projections) whose own
    modules compute `torch_qk_rope`'s values to run the op; without, unmark them (a model an
    earlier engine prepared). Returns how many attentions were routed."""
    from rollout.kernels import triton_qk_rope  # noqa: F401 - registers the op

    routed = 0
    for attn in model.modules():
        if hasattr(attn, "_unfused_forward") and hasattr(attn, "qkv_weight"):
            attn._qk_rope = enabled and _serves(attn)
            routed += attn._qk_rope
    return routed


def routed_qk_rope(attn: nn.Module, qkv: torch.Tensor, cos, sin) -> bool:
    """Whether this call runs the op: routed, and the activations, norm weights, cos and sin in
    one dtype (what the kernel and twin compute in)."""
    return (
        getattr(attn, "_qk_rope", False)
        and qkv.dtype == attn.q_norm.weight.dtype == attn.k_norm.weight.dtype
        and cos.dtype == sin.dtype == qkv.dtype
    )


def normed_rotated_qk(attn: nn.Module, qkv: torch.Tensor, cos, sin, write_kv: bool = False):
    """(query [1, q heads, tokens, head_dim], key [1, kv heads, tokens, head_dim]) from the
    fused q/k/v GEMM's output, as views of the op's one output. With `write_kv` (inside an
    engine step, our paged attention selected), the keys and values are also in this layer's
    cache when it returns, and the attention must not write them again."""
    num_q = attn.qkv_sizes[0] // attn.head_dim
    args = (
        qkv, attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.variance_epsilon, cos, sin,
        num_q, attn.qkv_sizes[1] // attn.head_dim,
    )  # fmt: skip
    if write_kv:
        normed = torch.ops.rollout.qk_norm_rope_into_cache(*args, attn.layer_idx)
    else:
        normed = torch.ops.rollout.qk_norm_rope(*args)
    return normed[..., :num_q, :].transpose(1, 2), normed[..., num_q:, :].transpose(1, 2)


# The cache is found through the step's forward context, not passed: torch.compile sees a
# function of qkv, as for vLLM's attention ops, and never the cache it writes (an in-place write
# into a graph input that the compiled layer would otherwise have to order or copy). The
# attention function that follows in the same layer is opaque to torch.compile and reads the
# cache only after this op has run.
@torch.library.custom_op("rollout::qk_norm_rope_into_cache", mutates_args=())
def qk_norm_rope_into_cache(
    qkv: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    layer_idx: int,
) -> torch.Tensor:
    """`rollout::qk_norm_rope`, and the normed, rotated keys and the values (qkv's last heads)
    written into layer `layer_idx`'s cache of the current engine step: by the same Triton
    launch under the Triton backend, else by the backend's `write_kv` after the op."""
    from rollout.engine.model.forward_context import get_forward_context
    from rollout.kernels import triton_qk_rope

    ctx = get_forward_context()
    k_cache, v_cache, k_scale, v_scale = ctx.kv_caches[layer_idx]
    args = (qkv, q_weight, k_weight, eps, cos, sin, num_q_heads, num_kv_heads)
    if ctx.backend.name == "triton":
        kv = triton_qk_rope.KVWrite(k_cache, v_cache, ctx.meta.slot_mapping, k_scale, v_scale)
        normed = triton_qk_rope.norm_rope_writing_kv(*args, kv)
        if normed is not None:
            return normed
    normed = torch.ops.rollout.qk_norm_rope(*args)
    head_dim = q_weight.shape[0]
    key = normed[..., num_q_heads:, :].reshape(-1, num_kv_heads, head_dim)
    value = qkv[..., (num_q_heads + num_kv_heads) * head_dim :]
    value = value.reshape(-1, num_kv_heads, head_dim)
    ctx.backend.write_kv(key, value, k_cache, v_cache, ctx.meta.slot_mapping, k_scale, v_scale)
    return normed


@qk_norm_rope_into_cache.register_fake
def _(qkv, q_weight, k_weight, eps, cos, sin, num_q_heads, num_kv_heads, layer_idx):
    return qkv.new_empty(*qkv.shape[:-1], num_q_heads + num_kv_heads, q_weight.shape[0])


def _serves(attn: nn.Module) -> bool:
    q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
    if type(q_norm).__name__ not in _QK_NORM_CLASSES or type(k_norm) is not type(q_norm):
        return False
    head_dim = attn.head_dim
    q_size, k_size = attn.qkv_sizes[:2]
    if (
        head_dim % 2
        or q_size % head_dim
        or k_size % head_dim
        or q_norm.weight.shape != (head_dim,)
        or k_norm.weight.shape != (head_dim,)
        or q_norm.variance_epsilon != k_norm.variance_epsilon
    ):
        return False
    return _computes_twin(attn)  # each layer's own: a patch may touch one instance


def _computes_twin(attn: nn.Module) -> bool:
    """Whether the module's own norms and rotary give `torch_qk_rope`'s values, bit for bit, on
    random rows on the module's device: a norm or rotary replaced under the same class name (a
    hub kernel, a patched forward) keeps the module's own path."""
    from rollout.kernels import torch_qk_rope

    weight, head_dim = attn.q_norm.weight, attn.head_dim
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(1, 3, sum(attn.qkv_sizes), generator=g).to(weight.device, weight.dtype)
    angles = torch.rand(1, 3, head_dim, generator=g) * 6.0
    cos, sin = (f(angles).to(weight.device, weight.dtype) for f in (torch.cos, torch.sin))
    q_size, k_size = attn.qkv_sizes[:2]
    with torch.no_grad():
        query = attn.q_norm(qkv[..., :q_size].reshape(1, 3, -1, head_dim)).transpose(1, 2)
        key = attn.k_norm(qkv[..., q_size : q_size + k_size].reshape(1, 3, -1, head_dim))
        query, key = attn._rotary(query, key.transpose(1, 2), cos, sin)
        own = torch.cat((query, key), dim=1).transpose(1, 2)
        twin = torch_qk_rope.qk_norm_rope(
            qkv, attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.variance_epsilon, cos, sin,
            q_size // head_dim, k_size // head_dim,
        )  # fmt: skip
    return own.shape == twin.shape and own.dtype == twin.dtype and torch.equal(own, twin)
