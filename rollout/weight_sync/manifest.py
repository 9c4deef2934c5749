"""What a sync carries: parameter names, shapes, the rollout dtype, and how they pack into buckets.

The trainer builds the manifest from its own parameters; every engine checks it against its model
before any tensor moves, so a mismatch is an error that names the parameters and changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from rollout.engine.model.loader import TORCH_DTYPES

DEFAULT_BUCKET_BYTES = 1 << 30


@dataclass(frozen=True)
class WeightManifest:
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtype: str
    """Rollout dtype every tensor is cast to before it is sent."""
    bucket_bytes: int = DEFAULT_BUCKET_BYTES

    @property
    def torch_dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.dtype]

    def buckets(self) -> list[list[int]]:
        """Parameter indices per transfer, in order; a tensor larger than the cap goes alone."""
        element = torch.empty((), dtype=self.torch_dtype).element_size()
        buckets, current, size = [], [], 0
        for i, shape in enumerate(self.shapes):
            nbytes = numel(shape) * element
            if current and size + nbytes > self.bucket_bytes:
                buckets.append(current)
                current, size = [], 0
            current.append(i)
            size += nbytes
        if current:
            buckets.append(current)
        return buckets

    def bucket_numel(self, bucket: list[int]) -> int:
        return sum(numel(self.shapes[i]) for i in bucket)


def manifest_for(
    named_tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype, bucket_bytes: int
) -> WeightManifest:
    specs = [(name, tuple(tensor.shape)) for name, tensor in named_tensors]
    return manifest_from_specs(specs, dtype, bucket_bytes)


def manifest_from_specs(
    specs: Iterable[tuple[str, Iterable[int]]], dtype: torch.dtype, bucket_bytes: int
) -> WeightManifest:
    """The manifest of tensors known only by (name, shape), in the order they will be sent: a
    sharded trainer describes its full tensors before it gathers any."""
    names, shapes = [], []
    for name, shape in specs:
        names.append(name)
        shapes.append(tuple(int(d) for d in shape))
    if len(set(names)) != len(names):
        repeated = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"weight sync: names listed twice: {repeated[:8]}")
    dtype_name = next(k for k, v in TORCH_DTYPES.items() if v == dtype)
    return WeightManifest(tuple(names), tuple(shapes), dtype_name, bucket_bytes)


def check_manifest(model: torch.nn.Module, manifest: WeightManifest) -> None:
    """Raise ValueError naming every parameter the model lacks, has extra, or shapes differently."""
    params = dict(model.named_parameters())
    missing = [n for n in manifest.names if n not in params]
    extra = [n for n in params if n not in set(manifest.names)]
    wrong = [
        f"{n}: sent {list(shape)}, engine has {list(params[n].shape)}"
        for n, shape in zip(manifest.names, manifest.shapes, strict=True)
        if n in params and tuple(params[n].shape) != tuple(shape)
    ]
    if missing or extra or wrong:
        parts = []
        if missing:
            parts.append(f"not in the rollout model: {missing[:8]}")
        if extra:
            parts.append(f"not sent by the trainer: {extra[:8]}")
        if wrong:
            parts.append(f"shape mismatch: {wrong[:8]}")
        raise ValueError(
            "weight sync refused, the trainer and rollout models differ ("
            + "; ".join(parts)
            + "); the rollout weights are unchanged"
        )


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
