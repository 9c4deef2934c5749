"""The CUDA IPC weight sync's CPU-side pieces: its control messages over a gloo group, and the
errors that point a user elsewhere (the GPU path itself is in tests/gpu/test_cuda_ipc_gpu.py)."""

from __future__ import annotations

import threading

import pytest
import torch

from rollout.weight_sync import WeightGroup, cuda_ipc, free_port


def test_cpu_weights_are_refused_with_a_pointer_to_gloo() -> None:
    with pytest.raises(ValueError, match="weight_sync_backend=gloo"):
        cuda_ipc.send_buckets(None, [[0]], [1], torch.float32, torch.device("cpu"), None)


def test_handle_bytes_and_barriers_reach_every_rank() -> None:
    port, world = free_port(), 3
    payload = bytes(range(256)) * 40
    got: dict[int, bytes] = {}
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            group = WeightGroup("127.0.0.1", port, r, world, "cuda_ipc", timeout_s=60)
            got[r] = cuda_ipc._broadcast_bytes(group, payload if r == 0 else None)
            for _ in range(3):
                assert cuda_ipc._failures(group, None) == 0
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert got == {r: payload for r in range(world)}


def test_an_engine_on_another_device_stops_both_sides_before_any_bucket() -> None:
    import pickle

    port = free_port()
    outcome: dict[str, object] = {}

    def trainer() -> None:
        group = WeightGroup("127.0.0.1", port, 0, 2, "cuda_ipc", timeout_s=60)
        cuda_ipc._broadcast_bytes(group, pickle.dumps(("GPU-trainer", None, ())))
        outcome["failures seen by the trainer"] = cuda_ipc._failures(group, None)

    def engine() -> None:
        group = WeightGroup("127.0.0.1", port, 1, 2, "cuda_ipc", timeout_s=60)
        try:
            cuda_ipc.receive_buckets(group, [[0]], [1], torch.float32, torch.device("cpu"), None)
        except RuntimeError as e:
            outcome["engine error"] = str(e)

    threads = [threading.Thread(target=f) for f in (trainer, engine)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert outcome["failures seen by the trainer"] == 1
    assert "same GPU" in outcome["engine error"] and "nccl" in outcome["engine error"]


def test_unknown_backend_names_the_choices() -> None:
    with pytest.raises(ValueError, match="cuda_ipc"):
        WeightGroup("127.0.0.1", free_port(), 0, 1, "mpi", timeout_s=5)


class _SameProcessIPC:
    """The GPU-only steps replaced for threads of one process: the "handle" names a buffer in a
    dict, mapping returns that very tensor, and waiting for the device is a no-op."""

    def __init__(self, monkeypatch) -> None:
        self.buffers: dict[bytes, torch.Tensor] = {}
        monkeypatch.setattr(cuda_ipc, "_require_gpu", lambda device: None)
        monkeypatch.setattr(cuda_ipc, "_share", self.share)
        monkeypatch.setattr(cuda_ipc, "_map", self.map)
        monkeypatch.setattr(cuda_ipc, "_wait_for", lambda device: None)
        self.fail_map = False

    def share(self, staging: torch.Tensor) -> bytes:
        key = str(len(self.buffers)).encode()
        self.buffers[key] = staging
        return key

    def map(self, payload: bytes, device) -> torch.Tensor:
        if self.fail_map:
            raise RuntimeError("cannot map this handle")
        return self.buffers[payload]


def _run_sync(world: int, numels: list[int], fail_copy_at: int | None = None):
    """Trainer (rank 0) sends buckets of arange values; engines collect copies. Returns
    (what each rank raised or returned, what each engine received)."""
    port = free_port()
    buckets = [[k] for k in range(len(numels))]
    outcome: dict[int, object] = {}
    received: dict[int, list[torch.Tensor]] = {r: [] for r in range(1, world)}

    def pack(bucket, out) -> None:
        out.copy_(torch.arange(out.numel(), dtype=out.dtype) + 1000 * bucket[0])

    def rank(r: int) -> None:
        group = WeightGroup("127.0.0.1", port, r, world, "cuda_ipc", timeout_s=60)
        try:
            if r == 0:
                outcome[r] = cuda_ipc.send_buckets(
                    group, buckets, numels, torch.float32, torch.device("cpu"), pack
                )
                return

            def unpack(bucket, flat) -> None:
                if bucket[0] == fail_copy_at and r == 1:
                    raise RuntimeError("copy failed")
                received[r].append(flat.clone())

            outcome[r] = cuda_ipc.receive_buckets(
                group, buckets, numels, torch.float32, torch.device("cpu"), unpack
            )
        except Exception as e:
            outcome[r] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a side is still waiting"
    return outcome, received


def test_every_bucket_reaches_every_engine_through_one_reused_buffer(monkeypatch) -> None:
    ipc = _SameProcessIPC(monkeypatch)
    numels = [5, 3, 5, 1]
    outcome, received = _run_sync(3, numels)
    assert outcome == {0: 14 * 4, 1: 14 * 4, 2: 14 * 4}
    assert len(ipc.buffers) == 1, "one staging buffer for the whole sync"
    for r in (1, 2):
        for k, flat in enumerate(received[r]):
            assert torch.equal(flat, torch.arange(numels[k], dtype=torch.float32) + 1000 * k)


def test_a_failed_copy_stops_every_side_at_that_bucket(monkeypatch) -> None:
    _SameProcessIPC(monkeypatch)
    outcome, received = _run_sync(3, [4, 4, 4], fail_copy_at=1)
    assert isinstance(outcome[0], RuntimeError) and "bucket 2 of 3" in str(outcome[0])
    assert "copy failed" in str(outcome[1])
    assert isinstance(outcome[2], RuntimeError) and "failed elsewhere" in str(outcome[2])
    assert len(received[2]) == 2, "the other engine stopped after the failed bucket"


def test_a_buffer_that_cannot_be_mapped_refuses_before_any_bucket(monkeypatch) -> None:
    ipc = _SameProcessIPC(monkeypatch)
    ipc.fail_map = True
    outcome, received = _run_sync(2, [4, 4])
    assert isinstance(outcome[0], RuntimeError) and "could not map" in str(outcome[0])
    assert "weights are unchanged" in str(outcome[0])
    assert "cannot map" in str(outcome[1]) and received[1] == []
