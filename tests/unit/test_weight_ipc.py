"""The CUDA IPC weight sync's CPU-side pieces: its control messages over a gloo group, and the
errors that point a user elsewhere (the GPU path itself is in tests/gpu/test_weight_ipc_gpu.py)."""

from __future__ import annotations

import threading

import pytest
import torch

from rollout import weight_ipc
from rollout.weights import WeightGroup, free_port


def test_cpu_weights_are_refused_with_a_pointer_to_gloo() -> None:
    with pytest.raises(ValueError, match="weight_sync_backend=gloo"):
        weight_ipc.send_buckets(None, [[0]], [1], torch.float32, torch.device("cpu"), None)


def test_handle_bytes_and_barriers_reach_every_rank() -> None:
    port, world = free_port(), 3
    payload = bytes(range(256)) * 40
    got: dict[int, bytes] = {}
    errors: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            group = WeightGroup("127.0.0.1", port, r, world, "cuda_ipc", timeout_s=60)
            got[r] = weight_ipc._broadcast_bytes(group, payload if r == 0 else None)
            for _ in range(3):
                weight_ipc._step(group)
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
        weight_ipc._broadcast_bytes(group, pickle.dumps(("GPU-trainer", None, ())))
        outcome["failures seen by the trainer"] = weight_ipc._failures(group, 0)

    def engine() -> None:
        group = WeightGroup("127.0.0.1", port, 1, 2, "cuda_ipc", timeout_s=60)
        try:
            weight_ipc.receive_buckets(group, [[0]], [1], torch.device("cpu"), None)
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
