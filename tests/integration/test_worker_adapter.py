"""A RolloutWorker (no Ray) merging LoRA adapters: every sync is exact from the original base
weights, refusals come before anything changes, and a merge that breaks part-way holds the
engine until an adapter sync succeeds."""

from __future__ import annotations

import pytest
import torch

from rollout.actors import adapter_merge
from rollout.weight_sync import TornWeightsError, adapter_manifest_for, send_weights
from tests.integration.test_worker_weights import _ReplayGroup

MODULES = (
    "model.layers.0.self_attn.q_proj",
    "model.layers.0.self_attn.v_proj",
    "model.layers.1.mlp.down_proj",
)


def lora_adapter(model: torch.nn.Module, seed: int, rank: int = 4, alpha: float = 8.0) -> list:
    """(module, A [r, in], B [out, r], alpha / r) for MODULES, random and not small."""
    g = torch.Generator().manual_seed(seed)
    weights = dict(model.named_parameters())
    adapter = []
    for module in MODULES:
        out_features, in_features = weights[f"{module}.weight"].shape
        lora_a = torch.randn(rank, in_features, generator=g) * 0.1
        lora_b = torch.randn(out_features, rank, generator=g) * 0.1
        adapter.append((module, lora_a, lora_b, alpha / rank))
    return adapter


def merged(base: dict[str, torch.Tensor], adapter: list) -> dict[str, torch.Tensor]:
    """What each adapted weight must be: the original base plus this adapter's delta alone."""
    return {
        f"{m}.weight": (base[f"{m}.weight"].float() + s * (b.float() @ a.float())).to(
            base[f"{m}.weight"].dtype
        )
        for m, a, b, s in adapter
    }


def sync_adapter(worker, adapter: list, version: int, bucket_bytes: int = 4 << 10) -> int:
    manifest, factors = adapter_manifest_for(adapter, bucket_bytes)
    recorded = _ReplayGroup()
    sent = send_weights(recorded, manifest.factors, factors, torch.device("cpu"))
    worker.weights.group = _ReplayGroup(recorded.buckets)
    worker.check_adapter(manifest)
    worker.receive_adapter(manifest, version)
    return sent


def sync_full_weights(worker, named: list, version: int) -> None:
    from rollout.weight_sync import manifest_for

    manifest = manifest_for(named, torch.float32, bucket_bytes=16 << 10)
    recorded = _ReplayGroup()
    send_weights(recorded, manifest, named, torch.device("cpu"))
    worker.weights.group = _ReplayGroup(recorded.buckets)
    worker.receive_weights(manifest, version=version)


def engine_weights(worker) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in worker.engine.model.named_parameters()}


def test_each_adapter_sync_is_exact_from_the_original_base(worker) -> None:
    base = engine_weights(worker)
    for version, seed in ((1, 10), (2, 11)):
        adapter = lora_adapter(worker.engine.model, seed)
        sent = sync_adapter(worker, adapter, version)
        assert sent == 4 * sum(a.numel() + b.numel() for _, a, b, _ in adapter), "factors only"
        now = engine_weights(worker)
        expected = merged(base, adapter)
        for name, weight in now.items():
            assert torch.equal(weight, expected.get(name, base[name])), name
        assert worker.version == version
    assert not torch.equal(
        now["model.layers.0.self_attn.q_proj.weight"],
        base["model.layers.0.self_attn.q_proj.weight"],
    )


def test_an_adapter_that_does_not_fit_is_refused_before_anything_changes(worker) -> None:
    base = engine_weights(worker)
    adapter = lora_adapter(worker.engine.model, seed=10)
    unknown = [*adapter, ("model.layers.0.self_attn.nope", *adapter[0][1:])]
    with pytest.raises(ValueError, match=r"self_attn\.nope"):
        sync_adapter(worker, unknown, version=1)
    module, lora_a, lora_b, scaling = adapter[1]
    wrong = [adapter[0], (module, lora_a[:, :-1], lora_b, scaling)]
    with pytest.raises(ValueError, match=r"v_proj: adapter is for \[\d+, 63\]"):
        sync_adapter(worker, wrong, version=1)
    assert all(torch.equal(w, base[n]) for n, w in engine_weights(worker).items())

    sync_adapter(worker, adapter, version=1)
    with pytest.raises(ValueError, match=r"left out: \['model.layers.1.mlp.down_proj'\]"):
        sync_adapter(worker, lora_adapter(worker.engine.model, seed=12)[:2], version=2)
    expected = merged(base, adapter)
    for name, weight in engine_weights(worker).items():
        assert torch.equal(weight, expected.get(name, base[name])), name
    assert worker.version == 1


class _BreakingMerge(adapter_merge.AdapterMerge):
    """Fails at the second module while `broken` (the first is merged by then)."""

    broken = True

    def merge(self, model, manifest, factors, unrounded=None):
        if self.broken:
            factors = dict(factors)
            factors[manifest.factor_names(manifest.modules[1])[0]] = None  # unreadable
        return super().merge(model, manifest, factors, unrounded)


def test_a_merge_that_breaks_part_way_holds_the_engine_until_an_adapter_sync(worker) -> None:
    base = engine_weights(worker)
    adapter = lora_adapter(worker.engine.model, seed=10)
    worker.weights.adapter = breaking = _BreakingMerge()
    with pytest.raises(TornWeightsError, match="after 1 of 3 modules"):
        sync_adapter(worker, adapter, version=1)
    assert worker.weights.torn
    with pytest.raises(RuntimeError, match="mix of two weight versions"):
        worker.resume()

    breaking.broken = False
    sync_adapter(worker, adapter, version=1)
    assert not worker.weights.torn
    worker.resume()
    expected = merged(base, adapter)
    for name, weight in engine_weights(worker).items():
        assert torch.equal(weight, expected.get(name, base[name])), name


def test_new_full_weights_become_the_base_of_the_next_adapter(worker) -> None:
    from tests.conftest import tiny_model

    sync_adapter(worker, lora_adapter(worker.engine.model, seed=10), version=1)
    named = list(tiny_model("llama", seed=99).named_parameters())
    sync_full_weights(worker, named, version=2)

    new_base = {n: p.detach().clone() for n, p in named}
    adapter = lora_adapter(worker.engine.model, seed=11)
    sync_adapter(worker, adapter, version=3)
    expected = merged(new_base, adapter)
    for name, weight in engine_weights(worker).items():
        assert torch.equal(weight, expected.get(name, new_base[name])), name


# ---- FP8 weights: the adapter merges into the unrounded base, and is rounded once ---------------


def _rounded(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    from rollout.kernels.torch_fp8 import dequantize_rows, quantize_rows

    return {n: dequantize_rows(*quantize_rows(w), w.dtype) for n, w in weights.items()}


def _small(adapter: list, factor: float) -> list:
    """The adapter with a delta well under the rounding step, as a LoRA's updates are."""
    return [(m, a * factor, b, s) for m, a, b, s in adapter]


def test_an_adapter_on_fp8_weights_is_rounded_once_from_the_unrounded_base(make_worker) -> None:
    from tests.conftest import tiny_model

    worker = make_worker(weight_quantization="fp8", fp8_keep_unrounded=True)
    checkpoint = {n: p.detach().clone() for n, p in tiny_model("llama", seed=4).named_parameters()}
    adapter = _small(lora_adapter(worker.engine.model, seed=10), 0.02)
    sync_adapter(worker, adapter, version=1)
    want = _rounded(merged(checkpoint, adapter))
    twice = _rounded(merged(_rounded(checkpoint), adapter))  # the double rounding avoided
    now = engine_weights(worker)
    differs = 0
    for name, weight in want.items():
        assert torch.equal(now[name], weight), name
        differs += int((weight != twice[name]).sum())
    assert differs > 0, "the delta never crossed a rounding boundary: the test shows nothing"
    # a second adapter merges from the same unrounded base
    second = _small(lora_adapter(worker.engine.model, seed=11), 0.02)
    sync_adapter(worker, second, version=2)
    now = engine_weights(worker)
    for name, weight in _rounded(merged(checkpoint, second)).items():
        assert torch.equal(now[name], weight), name


def test_full_weights_on_fp8_become_the_unrounded_base_of_the_next_adapter(make_worker) -> None:
    from tests.conftest import tiny_model

    worker = make_worker(weight_quantization="fp8", fp8_keep_unrounded=True)
    named = list(tiny_model("llama", seed=99).named_parameters())
    sync_full_weights(worker, named, version=1)
    adapter = _small(lora_adapter(worker.engine.model, seed=12), 0.02)
    sync_adapter(worker, adapter, version=2)
    new_base = {n: p.detach().clone() for n, p in named}
    now = engine_weights(worker)
    for name, weight in _rounded(merged(new_base, adapter)).items():
        assert torch.equal(now[name], weight), name


def test_an_adapter_on_fp8_weights_without_their_unrounded_values_is_refused(make_worker) -> None:
    worker = make_worker(weight_quantization="fp8")
    before = engine_weights(worker)
    with pytest.raises(ValueError, match="fp8_keep_unrounded=True"):
        sync_adapter(worker, lora_adapter(worker.engine.model, seed=10), version=1)
    assert all(torch.equal(w, before[n]) for n, w in engine_weights(worker).items())
