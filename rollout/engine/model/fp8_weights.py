"""FP8 weights for the decode GEMMs (`EngineConfig.weight_quantization="fp8"`).

A decode step's time is mostly the read of every weight; reading them as e4m3 halves the bytes.
Each quantized weight gets an FP8 copy (e4m3 values, a power-of-two scale per output row:
`rollout/kernels/torch_fp8.py`) and the weight itself is overwritten with the values that copy
stands for. The engine's model *is* then the FP8 model: a decode GEMM reads the FP8 bytes where
that measured faster (`triton_linear.fp8_pays`, `triton_moe.FP8_EXPERTS_MIN_TOKENS`), the bf16
weight elsewhere and for prefill's many rows, and all of them compute the same thing, up to
summation order. transformers' own forward over the same modules is the exactness oracle.

Quantized: every linear projection of the decoder layers (plain `nn.Linear` modules; the fused
q/k/v and gate/up as one tensor each, which per-row scales allow) and the MoE experts' 3-D
weights; the LM head too with `EngineConfig.fp8_lm_head`. Kept as they are: the embeddings,
norms, the routers (named `gate`, `router`, `*_gate`), whose top-k is sensitive to small
changes, and any subclass of `nn.Linear`, whose forward is its own.

With `EngineConfig.activation_quantization="fp8"` the decoder layers' quantized projections
round their inputs too: each row to e4m3 with a power-of-two scale of its own (the weights'
rule, `torch_fp8.quantize_rows`), or with "fp8-group" each 128 consecutive inputs of a row
(`torch_fp8.quantize_groups`), so the decode GEMMs can run on the tensor cores' FP8 MMA
(`triton_w8a8_linear.w8a8_linear`, called by `fp8_linear.py`). The model served is then the
one whose projections see those rounded inputs, at every batch size and in prefill alike
(exact in bf16, as the weights are); with `EngineConfig.fp8_lm_head_input`, the FP8 LM head too.

Weight sync writes the bf16 values into the same parameters as without FP8; `round_all` then
quantizes every tensor again in place on the device (LLMEngine.update_weights calls it after each
update, on the compute stream), so CUDA graphs stay valid. The price is memory: the FP8 copies add
half the quantized weights' bytes beside them, which the KV cache's sizing counts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn

from rollout.engine.model.capabilities import UnsupportedModelError
from rollout.engine.model.fp8_linear import fp8_linear_forward
from rollout.engine.model.fused_experts import experts_modules
from rollout.engine.model.loader import decoder_layers
from rollout.engine.weight_update import refuse_non_finite
from rollout.kernels.torch_fp8 import FP8_DTYPE, round_to_fp8_

_FUSED = {"qkv": ("q_proj", "k_proj", "v_proj"), "gate_up": ("gate_proj", "up_proj")}
_EXPERT_TENSORS = ("gate_up_proj", "down_proj")
INPUT_SCALES = {"none": None, "fp8": "row", "fp8-group": "group"}
"""EngineConfig.activation_quantization -> how the projections' inputs are rounded: not at all,
with a scale per row, or with a scale per 128 inputs of a row."""


@dataclass
class Fp8Weight:
    """One weight the engine keeps rounded, with its FP8 form."""

    name: str
    weight: torch.Tensor  # the model's own storage (a parameter, or a fused buffer)
    q: torch.Tensor  # e4m3, weight's shape
    scale: torch.Tensor  # fp32, one per output row
    unrounded: torch.Tensor | None = None  # host copy of the values before rounding, if kept


@dataclass
class Fp8Weights:
    """The model's quantized weights; `round_all()` after any change to them."""

    weights: list[Fp8Weight] = field(default_factory=list)
    last_round_s: float = 0.0
    """Seconds the last `round_all` took on the device."""

    @torch.no_grad()
    def keep_unrounded(self) -> None:
        """Copy every weight's current (not yet rounded) values to its host copy: at load, and
        after a full weight sync before `round_all`. Only where the copies were made."""
        for w in self.weights:
            if w.unrounded is not None:
                w.unrounded.copy_(w.weight)

    @property
    def keeps_unrounded(self) -> bool:
        return bool(self.weights) and self.weights[0].unrounded is not None

    def unrounded(self, param: torch.Tensor) -> torch.Tensor | None:
        """The values `param` (a quantized weight, or a view of a fused one) held before its last
        rounding, on its device; None if it is not quantized or no host copies are kept."""
        storage = param.untyped_storage().data_ptr()
        for w in self.weights:
            if w.unrounded is None or w.weight.untyped_storage().data_ptr() != storage:
                continue
            offset = param.storage_offset() - w.weight.storage_offset()
            kept = w.unrounded.as_strided(param.shape, param.stride(), offset)
            return kept.to(param.device, copy=True)
        return None

    @torch.no_grad()
    def round_all(self) -> float:
        """Quantize every weight again and round it to its FP8 value, in place; returns the
        seconds taken (the device's work included)."""
        start = time.perf_counter()
        for w in self.weights:
            round_to_fp8_(w.weight, w.q, w.scale)
        # The decode kernels widen e4m3's NaN to a finite value (triton_fp8_widen), so a weight
        # that is not finite is refused here, not served.
        refuse_non_finite(((w.name, w.weight) for w in self.weights), "weight_quantization='fp8'")
        self.last_round_s = time.perf_counter() - start
        return self.last_round_s


def is_router(name: str) -> bool:
    """Routers stay unquantized: `gate` (Mixtral, OLMoE), `shared_expert_gate` (Qwen2-MoE),
    `router`."""
    leaf = name.rsplit(".", 1)[-1]
    return leaf in ("gate", "router") or leaf.endswith(("_gate", "_router"))


def quantized_tensors(model: nn.Module, lm_head: bool = False) -> list[tuple[str, nn.Module, str]]:
    """(name, module, attribute) of each tensor FP8 covers, in module order: a fused q/k/v or
    gate/up buffer once for its member projections, each other linear's weight, and each experts
    module's `gate_up_proj` and `down_proj`; then, with `lm_head`, the LM head's weight."""
    found: list[tuple[str, nn.Module, str]] = []
    head = model.get_output_embeddings()
    try:
        layers = decoder_layers(model, setting="weight_quantization")
    except ValueError as err:
        raise UnsupportedModelError(
            f"weight_quantization='fp8': cannot find the decoder layers of "
            f"{type(model).__name__}; set weight_quantization='none'"
        ) from err
    for index, layer in enumerate(layers):
        fused_members: set[int] = set()
        for name, module in layer.named_modules():
            for fused, members in _FUSED.items():
                if getattr(module, f"{fused}_weight", None) is not None:
                    found.append(
                        (f"layers.{index}.{name}.{fused}_weight", module, f"{fused}_weight")
                    )
                    fused_members.update(id(getattr(module, m)) for m in members)
        experts = {id(m) for m in experts_modules(layer)}
        for name, module in layer.named_modules():
            prefix = f"layers.{index}.{name}"
            if id(module) in experts:
                for attribute in _EXPERT_TENSORS:
                    tensor = getattr(module, attribute, None)
                    if isinstance(tensor, torch.Tensor) and tensor.dim() == 3:
                        found.append((f"{prefix}.{attribute}", module, attribute))
            elif (
                type(module) is nn.Linear  # a subclass (a router, say) runs a forward of its own
                and id(module) not in fused_members
                and module is not head
                and not is_router(name)
            ):
                found.append((f"{prefix}.weight", module, "weight"))
    if not found:
        raise UnsupportedModelError(
            f"weight_quantization='fp8': {type(model).__name__}'s decoder layers have no "
            "nn.Linear projections or 3-D expert weights to quantize; set weight_quantization='none'"
        )
    if lm_head:
        found.append(("lm_head.weight", _plain_head(model), "weight"))
    return found


def _plain_head(model: nn.Module) -> nn.Linear:
    head = model.get_output_embeddings()
    if type(head) is not nn.Linear:
        raise UnsupportedModelError(
            f"fp8_lm_head: {type(model).__name__}'s LM head is {type(head).__name__}, not a "
            "plain nn.Linear; set fp8_lm_head=False"
        )
    embeddings = model.get_input_embeddings()
    if embeddings is not None and head.weight is getattr(embeddings, "weight", None):
        raise UnsupportedModelError(
            f"fp8_lm_head: {type(model).__name__} ties its LM head to its input embeddings, "
            "which rounding the head would change too; set fp8_lm_head=False"
        )
    return head


def fp8_bytes_needed(model: nn.Module, lm_head: bool = False) -> int:
    """The bytes the FP8 copies of `model` will take (before or after fusing projections)."""
    total = 0
    for _, module, attribute in quantized_tensors(model, lm_head):
        tensor = getattr(module, attribute)
        total += tensor.numel() + tensor[..., 0].numel() * 4
    return total


def quantize_model(
    model: nn.Module,
    keep_unrounded: bool = False,
    lm_head: bool = False,
    activations: str | None = None,
    head_input: bool = False,
) -> Fp8Weights:
    """Give every covered weight its FP8 copy, round the weights to it, and route the forwards
    that can read it (the linears' and, through fused_experts_forward, the experts'). With
    `keep_unrounded`, each weight's values before rounding stay in host memory (pinned beside a
    GPU) for `Fp8Weights.unrounded`: the base a LoRA adapter merges into. `lm_head`: the LM head
    too; `activations` ("row" or "group", INPUT_SCALES): the decoder layers' projections round
    their inputs (module docstring), and the LM head its own with `head_input`."""
    weights = Fp8Weights()
    tensors = quantized_tensors(model, lm_head)
    clear_fp8(model)  # an earlier engine's copies go (one of a head left alone here would be stale)
    head = model.get_output_embeddings()
    experts = [name for name, _, attribute in tensors if attribute in _EXPERT_TENSORS]
    if activations not in (None, "row", "group"):
        raise ValueError(
            f"quantize_model: activations is None, 'row' or 'group'; got {activations!r}"
        )
    if head_input and not (lm_head and activations):
        raise ValueError("quantize_model: head_input rounds the FP8 head's input like the layers'")
    if activations and experts:
        raise UnsupportedModelError(
            f"activation_quantization (FP8): {type(model).__name__}'s MoE experts ({experts[0]}, "
            "...) would still read unrounded activations; only dense models are served with it. "
            "Set activation_quantization='none'"
        )
    cuda = next((p.device for p in model.parameters() if p.is_cuda), None)
    if cuda is not None:  # registers rollout::decode_linear; its K-split counters before capture
        from rollout.kernels import triton_linear

        triton_linear.prepare_split_k(cuda)
    for name, module, attribute in tensors:
        tensor = getattr(module, attribute)
        q = torch.empty(tensor.shape, dtype=FP8_DTYPE, device=tensor.device)
        scale = torch.empty(tensor.shape[:-1], dtype=torch.float32, device=tensor.device)
        unrounded = None
        if keep_unrounded:
            # the weight's own strides, so a view of it maps by its storage offset
            unrounded = torch.empty_strided(
                tensor.shape, tensor.stride(), dtype=tensor.dtype, pin_memory=tensor.is_cuda
            )
        weights.weights.append(Fp8Weight(name, tensor.data, q, scale, unrounded))
        # a linear's FP8 form: (e4m3 weight, its row scales, how its inputs are rounded: None,
        # "row" or "group")
        fp8 = (q, scale, activations if module is not head or head_input else None)
        if attribute.endswith("_weight"):  # a fused projection's buffer: its forward reads this
            setattr(module, f"_fp8_{attribute.removesuffix('_weight')}", fp8)
        elif attribute == "weight":
            module._fp8 = fp8
            if not hasattr(module, "_plain_forward"):  # (the LM head's may be routed already)
                module._plain_forward = module.forward
            module.forward = fp8_linear_forward.__get__(module)
        else:  # experts
            setattr(module, f"_fp8_{attribute}", (q, scale))
    weights.keep_unrounded()
    weights.round_all()
    return weights


def clear_fp8(model: nn.Module) -> None:
    """Undo `quantize_model`'s routing (the weights keep their rounded values): for an engine
    without FP8 over a model an FP8 engine prepared before, whose copies would go stale."""
    for module in model.modules():
        if hasattr(module, "_fp8"):
            del module._fp8
            if "forward" in vars(module):
                del module.forward  # back to the class's forward
            module.__dict__.pop("_plain_forward", None)
        for attribute in ("_fp8_qkv", "_fp8_gate_up"):
            if getattr(module, attribute, None) is not None:
                setattr(module, attribute, None)
        for attribute in ("_fp8_gate_up_proj", "_fp8_down_proj"):
            module.__dict__.pop(attribute, None)


def fp8_read_bytes_saved(model: nn.Module) -> tuple[int, int]:
    """(dense, expert) bytes a decode step does not read because they are read as FP8 (0, 0
    without FP8): the rooflines of the benchmarks count what the engine reads."""
    dense = expert = 0
    for module in model.modules():
        pairs = []
        if getattr(module, "_fp8", None) is not None:
            pairs.append((module.weight, module._fp8, False))
        for fused in _FUSED:
            if getattr(module, f"_fp8_{fused}", None) is not None:
                pairs.append(
                    (getattr(module, f"{fused}_weight"), getattr(module, f"_fp8_{fused}"), False)
                )
        for attribute in ("gate_up_proj", "down_proj"):
            if getattr(module, f"_fp8_{attribute}", None) is not None:
                pairs.append(
                    (getattr(module, attribute), getattr(module, f"_fp8_{attribute}"), True)
                )
        for weight, (q, scale, *_), is_expert in pairs:
            saved = weight.numel() * weight.element_size() - q.numel() - 4 * scale.numel()
            if is_expert:
                expert += saved
            else:
                dense += saved
    return dense, expert
