"""What the device under a launch offers the kernels' host code: Triton compiled for an NVIDIA
GPU, the e4m3 instructions of compute capability 8.9 and up, its SMs and shared memory.

The kernels' fast paths are written in PTX (`tl.inline_asm_elementwise`) or lean on Hopper's and
Ada's FP8 instructions, so each launch asks here before taking them; elsewhere (AMD's GPUs,
Triton's CPU interpreter, older NVIDIA GPUs) it takes the portable path, which computes the same
values.
"""

from __future__ import annotations

import functools
import os

import torch


def compiled_on_nvidia(device: torch.device) -> bool:
    """Whether a Triton launch on `device` runs compiled for an NVIDIA GPU: not on AMD's (HIP) and
    not under Triton's CPU interpreter (TRITON_INTERPRET=1), where inline PTX cannot run."""
    return (
        device.type == "cuda"
        and torch.version.hip is None
        and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
    )


def has_e4m3_instructions(device: torch.device) -> bool:
    """Whether `device` also has the e4m3 instructions: the FP8 MMA and the conversions to and
    from e4m3 (compute capability 8.9 and up: Ada, Hopper and later)."""
    return compiled_on_nvidia(device) and torch.cuda.get_device_capability(device) >= (8, 9)


@functools.cache
def _properties(device_index: int):
    return torch.cuda.get_device_properties(device_index)


def _cuda_properties(device: torch.device):
    return _properties(device.index if device.index is not None else torch.cuda.current_device())


def sm_count(device: torch.device) -> int:
    """The device's SMs; 0 off CUDA (the interpreter), where the tail tiles are not chosen."""
    return _cuda_properties(device).multi_processor_count if device.type == "cuda" else 0


def shared_memory_per_program(device: torch.device) -> int:
    """The most shared memory one program may ask for on `device`, in bytes (227 KiB on Hopper,
    99 KiB on Ada); 0 off CUDA."""
    if device.type != "cuda":
        return 0
    return getattr(_cuda_properties(device), "shared_memory_per_block_optin", 0)
