"""Weight sync over CUDA IPC between two processes on one GPU, without Ray: many small buckets
through one reused staging buffer must arrive exactly, cast to the rollout dtype."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from tests.conftest import tiny_model

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)


def _engine_side(port: int, manifest, results) -> None:
    import faulthandler

    from rollout.weight_sync import WeightGroup, receive_weights

    faulthandler.dump_traceback_later(100, exit=True)  # a hang shows where, then ends
    try:
        torch.cuda.set_device(0)
        model = tiny_model("llama", seed=1).to("cuda", torch.bfloat16)
        print("[engine] joining", flush=True)
        group = WeightGroup("127.0.0.1", port, 1, 2, "cuda_ipc", timeout_s=60)
        for _ in range(2):  # the second sync maps a new staging buffer through the same group
            received = receive_weights(group, manifest, model)
        # numpy arrays travel by value; torch CPU tensors would need this process alive.
        params = {n: p.detach().float().cpu().numpy() for n, p in model.named_parameters()}
        results.put(("ok", received, params))
    except BaseException as e:  # report, or the parent waits for the timeout
        results.put(("error", repr(e), None))


def test_many_buckets_arrive_exactly_through_one_staging_buffer() -> None:
    from rollout.weight_sync import WeightGroup, free_port, manifest_for, send_weights

    trainer = tiny_model("llama", seed=7).to("cuda:0")  # fp32: the sender casts to bf16
    named = list(trainer.named_parameters())
    manifest = manifest_for(named, torch.bfloat16, bucket_bytes=16 * 1024)
    assert len(manifest.buckets()) > 4, "several buckets reuse the staging buffer"
    port = free_port()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    engine = ctx.Process(target=_engine_side, args=(port, manifest, results))
    engine.start()
    try:
        print("[trainer] waiting for the engine process to join", flush=True)
        group = WeightGroup("127.0.0.1", port, 0, 2, "cuda_ipc", timeout_s=60)
        for k in range(2):
            sent = send_weights(group, manifest, named, torch.device("cuda:0"))
            print(f"[trainer] sync {k + 1} sent {sent} bytes", flush=True)
        status, received, params = results.get(timeout=60)
    finally:
        engine.join(timeout=60)
        if engine.is_alive():
            engine.kill()
    assert status == "ok", received
    assert received == sent > 0
    for name, p in named:
        expected = p.detach().to(torch.bfloat16).float().cpu()
        assert torch.equal(torch.from_numpy(params[name]), expected), name


def _engine_side_lazy_then_adapter(port: int, manifest, adapter_manifest, results) -> None:
    import faulthandler

    from rollout.actors.adapter_merge import AdapterMerge
    from rollout.weight_sync import WeightGroup, receive_into, receive_weights

    faulthandler.dump_traceback_later(100, exit=True)
    try:
        torch.cuda.set_device(0)
        model = tiny_model("llama", seed=1).to("cuda", torch.bfloat16)
        group = WeightGroup("127.0.0.1", port, 1, 2, "cuda_ipc", timeout_s=60)
        received = receive_weights(group, manifest, model)
        factors = {
            name: torch.empty(shape, dtype=torch.float32, device="cuda")
            for name, shape in zip(
                adapter_manifest.factors.names, adapter_manifest.factors.shapes, strict=True
            )
        }
        received += receive_into(group, adapter_manifest.factors, factors)
        AdapterMerge().merge(model, adapter_manifest, factors)
        params = {n: p.detach().float().cpu().numpy() for n, p in model.named_parameters()}
        results.put(("ok", received, params))
    except BaseException as e:
        results.put(("error", repr(e), None))


def test_a_lazy_sync_then_an_adapter_merge_arrive_exactly() -> None:
    """Full weights pulled bucket by bucket from a generator, then a LoRA adapter's float32
    factors into plain buffers, merged into the bf16 weights on the engine's GPU."""
    from rollout.weight_sync import (
        WeightGroup,
        adapter_manifest_for,
        free_port,
        manifest_from_specs,
        send_weights,
    )
    from tests.integration.test_worker_adapter import lora_adapter

    trainer = tiny_model("llama", seed=7).to("cuda:0")
    specs = [(n, tuple(p.shape)) for n, p in trainer.named_parameters()]
    manifest = manifest_from_specs(specs, torch.bfloat16, bucket_bytes=16 * 1024)
    adapter = [(m, a.cuda(), b.cuda(), s) for m, a, b, s in lora_adapter(trainer, seed=3)]
    adapter_manifest, factors = adapter_manifest_for(adapter, bucket_bytes=4 * 1024)
    port = free_port()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    engine = ctx.Process(
        target=_engine_side_lazy_then_adapter, args=(port, manifest, adapter_manifest, results)
    )
    engine.start()
    try:
        group = WeightGroup("127.0.0.1", port, 0, 2, "cuda_ipc", timeout_s=60)
        pulled = ((n, p.detach().clone()) for n, p in trainer.named_parameters())
        sent = send_weights(group, manifest, pulled, torch.device("cuda:0"), lazy=True)
        sent += send_weights(group, adapter_manifest.factors, factors, torch.device("cuda:0"))
        status, received, params = results.get(timeout=60)
    finally:
        engine.join(timeout=60)
        if engine.is_alive():
            engine.kill()
    assert status == "ok", received
    assert received == sent > 0
    with torch.no_grad():
        expected = {n: p.detach().to(torch.bfloat16) for n, p in trainer.named_parameters()}
        for module, lora_a, lora_b, scaling in adapter:
            base = expected[f"{module}.weight"]
            delta = scaling * (lora_b.float() @ lora_a.float())
            expected[f"{module}.weight"] = (base.float() + delta).to(torch.bfloat16)
    for name, weight in expected.items():
        assert torch.equal(torch.from_numpy(params[name]), weight.float().cpu()), name
