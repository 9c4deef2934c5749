"""Which kernel paths a device gets: compiled NVIDIA Triton, and the e4m3 instructions on top."""

from __future__ import annotations

import pytest
import torch

from rollout.kernels.gpu_features import compiled_on_nvidia, has_e4m3_instructions

CUDA = torch.device("cuda")


def test_only_compiled_nvidia_launches_take_the_ptx_paths(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.version, "hip", None)
    assert compiled_on_nvidia(CUDA)
    assert not compiled_on_nvidia(torch.device("cpu"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the CPU interpreter cannot run inline PTX
    assert not compiled_on_nvidia(CUDA)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert compiled_on_nvidia(CUDA)
    monkeypatch.setattr(torch.version, "hip", "6.2")  # AMD's GPUs show as "cuda" too
    assert not compiled_on_nvidia(CUDA)


@pytest.mark.parametrize(
    "capability,expected", [((8, 0), False), ((8, 6), False), ((8, 9), True), ((9, 0), True)]
)
def test_the_e4m3_instructions_start_at_compute_capability_8_9(
    capability, expected, monkeypatch
) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert has_e4m3_instructions(CUDA) is expected
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not has_e4m3_instructions(CUDA)
