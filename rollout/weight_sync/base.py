"""The one interface every weight transport implements: move buckets from rank 0 to the engines.

`rollout.weight_sync.transfer` decides what goes into each bucket (names, casts, in-place copies);
a transport only moves flat buffers: `pack(bucket, out)` fills one on the trainer, and
`unpack(bucket, flat)` copies one into the engine's parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from rollout.weight_sync.group import WeightGroup

Pack = Callable[[list[int], torch.Tensor], None]


class WeightTransport(Protocol):
    def send_buckets(
        self,
        group: WeightGroup,
        buckets: list[list[int]],
        numels: list[int],
        dtype: torch.dtype,
        device: torch.device,
        pack: Pack,
    ) -> int:
        """Trainer side: fill and send every bucket; returns bytes sent."""
        ...

    def receive_buckets(
        self,
        group: WeightGroup,
        buckets: list[list[int]],
        numels: list[int],
        dtype: torch.dtype,
        device: torch.device,
        unpack: Pack,
    ) -> int:
        """Engine side: receive every bucket and hand it to `unpack`; returns bytes received."""
        ...
