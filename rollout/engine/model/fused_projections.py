"""One GEMM for q/k/v and one for gate/up, with transformers' parameter names kept.

At decode batch sizes (tens of rows) every projection is a skinny GEMM bound by reading its
weight; cuBLAS runs the small ones as split-K kernels plus a reduction launch each. A profile of
w1 (Llama-3-8B shape, batch 32) put the GEMMs well above their weight-read floor, with five
projection GEMMs per layer before the output and down projections (docs/performance.md, 'Where
w1's time went before fusion'). Reading q, k and v from one [q+k+v, hidden] weight, and gate and
up from one [2 x intermediate, hidden] weight, halves those launches and gives cuBLAS wider
problems.

The names stay: `q_proj.weight` & co. become views into the fused tensor, so weight sync (which
copies by name, in place) updates the fused weight, and CUDA graphs captured on it stay valid.
The fused forward runs only without autograd; with gradients enabled the module's own forward
runs, so a model that is also trained still gets gradients on its own parameters.

Only the attention and MLP classes whose forward was checked against the fused one are changed
(`_ATTENTION_CLASSES`, `_MLP_CLASSES`); any other model runs its own modules unchanged.

`route_decode_linears` goes one step further on CUDA: the output, down and LM-head projections,
where our Triton kernel beat cuBLAS at decode batch sizes (rollout/kernels/triton_linear.py),
run through it; q/k/v and gate/up stay with cuBLAS, which was faster there.

Where `fused_qk_rope.route_qk_rope` routed it, the fused attention's q/k norms and rotary run
as one op (fused_qk_rope.py), which inside an engine step also writes the keys and values into
the paged cache (the attention is told so and does not write them again).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Collection

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from rollout.engine.model.attention import ATTENTION_NAME
from rollout.engine.model.fp8_linear import fp8_linear, reads_fp8_form_only
from rollout.engine.model.fused_qk_rope import normed_rotated_qk, routed_qk_rope
from rollout.engine.model.loader import decoder_layers
from rollout.kernels import (
    triton_gate_up_silu,
    triton_rounded_rows,  # noqa: F401 - registers the rounding act's op
)
from rollout.kernels.linear_residual import plus_residual

# transformers classes whose forward is: q/k/v projections -> [q_norm/k_norm] -> rotary ->
# attention interface -> o_proj (the Qwen3 family adds the per-head norms); with the sliding
# window each passes to the attention function, read where its own forward reads it.
# The MoE families' attention (Mixtral, Qwen3-MoE) is their dense sibling's forward, line for
# line; at an MoE model's 2,048-wide hidden state the separate k and v GEMMs are launches that
# read 2 MB each.
_ATTENTION_CLASSES = {
    "LlamaAttention": lambda attn: None,
    "MistralAttention": lambda attn: getattr(attn.config, "sliding_window", None),
    "MixtralAttention": lambda attn: getattr(attn.config, "sliding_window", None),
    "Qwen2Attention": lambda attn: getattr(attn, "sliding_window", None),
    "Qwen3Attention": lambda attn: getattr(attn, "sliding_window", None),
    "Qwen3MoeAttention": lambda attn: getattr(attn, "sliding_window", None),
}
# ... and whose MLP is down(act(gate(x)) * up(x)).
_MLP_CLASSES = {"LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP"}


def fuse_projections(model: nn.Module) -> int:
    """Fuse q/k/v and gate/up of every decoder layer in place; returns how many modules changed
    (none for a model whose layers are not the known classes)."""
    changed = 0
    for layer in _layers_or_none(model):
        attn = getattr(layer, "self_attn", None)
        if _fusable(attn, _ATTENTION_CLASSES, "qkv_weight"):
            _fuse_linears(attn, ("q_proj", "k_proj", "v_proj"), "qkv")
            attn._rotary = sys.modules[type(attn).__module__].apply_rotary_pos_emb
            attn._sliding_window = _ATTENTION_CLASSES[type(attn).__name__](attn)
            attn._unfused_forward = attn.forward
            attn.forward = types.MethodType(_fused_attention_forward, attn)
            changed += 1
        mlp = getattr(layer, "mlp", None)
        if _fusable(mlp, _MLP_CLASSES, "gate_up_weight"):
            _fuse_linears(mlp, ("gate_proj", "up_proj"), "gate_up")
            mlp._unfused_forward = mlp.forward
            mlp.forward = types.MethodType(_fused_mlp_forward, mlp)
            changed += 1
    return changed


def route_decode_linears(model: nn.Module) -> int:
    """Send o_proj, down_proj (of fused layers) and the LM head through `rollout::decode_linear`
    when the model runs without autograd; returns how many projections were routed."""
    from rollout.kernels import triton_linear

    routed = 0
    for layer in _layers_or_none(model):
        for module, name in (
            (layer.self_attn, "o_proj"),
            (getattr(layer, "mlp", None), "down_proj"),
        ):
            linear = getattr(module, name, None)
            if (
                hasattr(module, "_unfused_forward")  # only the fused forwards call _project
                and isinstance(linear, nn.Linear)
                and triton_linear.supported(linear.weight)
            ):
                linear._decode_linear = True
                routed += 1
    head = model.get_output_embeddings()
    if isinstance(head, nn.Linear) and triton_linear.supported(head.weight):
        head._decode_linear = True  # read by an FP8 head's forward where its FP8 copy does not pay
        if not hasattr(head, "_plain_forward"):
            head._plain_forward = head.forward
            head.forward = types.MethodType(_decode_head_forward, head)
        routed += 1
    return routed


def _layers_or_none(model: nn.Module) -> list[nn.Module]:
    try:
        return decoder_layers(model, setting="fuse_projections")
    except ValueError:  # not a layout this module knows: the model runs unchanged
        return []


def _project(linear: nn.Linear, x: torch.Tensor, rounded_input=None, residual=None) -> torch.Tensor:
    """linear(x), or residual + linear(x): the GEMM's kernel adds it where one runs."""
    fp8 = getattr(linear, "_fp8", None)  # fp8_weights.py
    if fp8 is not None:
        triton_bf16 = getattr(linear, "_decode_linear", False)
        return fp8_linear(x, linear.weight, linear.bias, fp8, triton_bf16, rounded_input, residual)
    if getattr(linear, "_decode_linear", False):
        return torch.ops.rollout.decode_linear(
            x, linear.weight, linear.bias, None, None, True, residual
        )
    return plus_residual(linear(x), residual)


def _fused_linear(x, weight, bias, fp8, rounded_input=None) -> torch.Tensor:
    """The fused GEMM: cuBLAS, or with FP8 weights our FP8 GEMM where it pays; `rounded_input`:
    x's FP8 form when a rounding norm made x (rounded_layers.py)."""
    if fp8 is None:
        return F.linear(x, weight, bias)
    return fp8_linear(x, weight, bias, fp8, rounded_input=rounded_input)


def _decode_head_forward(self, x):
    if torch.is_grad_enabled():  # training: the plain nn.Linear, with gradients
        return self._plain_forward(x)
    return torch.ops.rollout.decode_linear(x, self.weight, self.bias)


def _fusable(module: nn.Module | None, classes: Collection[str], fused_buffer: str) -> bool:
    # A second engine over the same in-memory model finds it fused already.
    return type(module).__name__ in classes and not hasattr(module, fused_buffer)


def _fuse_linears(module: nn.Module, names: tuple[str, ...], fused_name: str) -> None:
    linears = [getattr(module, name) for name in names]
    has_bias = linears[0].bias is not None
    if any((lin.bias is not None) != has_bias for lin in linears):
        raise ValueError(f"{type(module).__name__}: {names} mix biased and unbiased projections")
    sizes = [lin.out_features for lin in linears]
    weight = torch.cat([lin.weight.detach() for lin in linears], dim=0)
    bias = torch.cat([lin.bias.detach() for lin in linears], dim=0) if has_bias else None
    # Buffers, not parameters: the names the trainer and weight sync know stay on the linears.
    module.register_buffer(f"{fused_name}_weight", weight, persistent=False)
    module.register_buffer(f"{fused_name}_bias", bias, persistent=False)
    setattr(module, f"{fused_name}_sizes", sizes)
    setattr(module, f"_fp8_{fused_name}", None)  # set by fp8_weights.quantize_model
    offset = 0
    for lin, size in zip(linears, sizes, strict=True):
        # Each original parameter becomes a view of its rows of the fused tensor (same storage).
        grad = lin.weight.requires_grad
        lin.weight = nn.Parameter(weight[offset : offset + size], requires_grad=grad)
        if has_bias:
            lin.bias = nn.Parameter(bias[offset : offset + size], requires_grad=grad)
        offset += size


def _fused_attention_forward(
    self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs
):
    # Training, transformers' own KV cache (generate), or its "eager" attention (no registered
    # function): the module's own forward.
    # (get_interface, as transformers' own forward calls it: known to trace under torch.compile)
    attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, None)
    # hidden_states' FP8 form, from a rounding norm (rounded_layers.py); the module's own forward
    # rounds again where it needs to, which gives the same rows back
    rounded_input = kwargs.pop("rounded_input", None)
    if torch.is_grad_enabled() or kwargs.get("cache") is not None or attention is None:
        return self._unfused_forward(
            hidden_states, position_embeddings=position_embeddings,
            attention_mask=attention_mask, **kwargs
        )  # fmt: skip
    kwargs.pop("cache", None)
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    qkv = _fused_linear(hidden_states, self.qkv_weight, self.qkv_bias, self._fp8_qkv, rounded_input)
    query, key, value = qkv.split(self.qkv_sizes, dim=-1)
    value = value.reshape(hidden_shape).transpose(1, 2)
    cos, sin = position_embeddings
    if routed_qk_rope(self, qkv, cos, sin):  # q/k norms and rotary: one launch
        # inside an engine step the same launch writes the keys and values into the cache
        kv_written = self.config._attn_implementation == ATTENTION_NAME
        query, key = normed_rotated_qk(self, qkv, cos, sin, write_kv=kv_written)
        if kv_written:
            kwargs["kv_written"] = True
    else:
        query = query.reshape(hidden_shape)
        key = key.reshape(hidden_shape)
        if hasattr(self, "q_norm"):
            query = self.q_norm(query)
            key = self.k_norm(key)
        query, key = self._rotary(query.transpose(1, 2), key.transpose(1, 2), cos, sin)
    out, weights = attention(
        self,
        query,
        key,
        value,
        attention_mask,
        dropout=0.0,
        scaling=self.scaling,
        sliding_window=self._sliding_window,
        **kwargs,
    )
    out = out.reshape(*input_shape, -1).contiguous()
    return _project(self.o_proj, out), weights


def _fused_mlp_forward(self, x, rounded_input=None, residual=None):
    """The MLP; with `residual`, residual + the MLP (the layer's add, in down's GEMM)."""
    if torch.is_grad_enabled():
        return plus_residual(self._unfused_forward(x), residual)
    input_scales = _rounded_silu(self)
    if input_scales == "row" and rounded_input is not None:
        x8, x_scale = rounded_input
        fp8_weight, fp8_scale, _ = self._fp8_gate_up
        if triton_gate_up_silu.serves(x8, x_scale, self.gate_up_weight, self.gate_up_bias):
            # decode's rows: the activation and its rounding in gate/up's GEMM and one spread
            # launch, not a launch of one program a row (triton_gate_up_silu.py)
            q, scale = torch.ops.rollout.gate_up_silu_rounded(
                x8, x_scale, self.gate_up_weight, fp8_weight, fp8_scale
            )
            unread = x.new_empty(*x.shape[:-1], 0)  # down reads only the FP8 form
            return _project(self.down_proj, unread, rounded_input=(q, scale), residual=residual)
    gate_up = _fused_linear(
        x, self.gate_up_weight, self.gate_up_bias, self._fp8_gate_up, rounded_input
    )
    if input_scales is not None:  # FP8 activations: rounded in the activation's kernel
        y, q, scale = torch.ops.rollout.silu_mul_rounded(
            gate_up, input_scales == "group", not reads_fp8_form_only(gate_up)
        )
        return _project(self.down_proj, y, rounded_input=(q, scale), residual=residual)
    gate, up = gate_up.split(self.gate_up_sizes, dim=-1)
    return _project(self.down_proj, self.act_fn(gate) * up, residual=residual)


def _rounded_silu(mlp: nn.Module) -> str | None:
    """How down_proj rounds its input (fp8_weights.INPUT_SCALES' "row" or "group") where the
    activation is SiLU and can round it in its own kernel (triton_rounded_rows), else None."""
    fp8 = getattr(mlp.down_proj, "_fp8", None)
    if (
        fp8 is None
        or fp8[2] is None
        or type(mlp.act_fn).__name__ not in ("SiLUActivation", "SiLU")
        or len(set(mlp.gate_up_sizes)) != 1
    ):
        return None
    return fp8[2]
