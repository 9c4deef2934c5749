"""One of the two input/output slots of the step pipeline.

Step N uses slot N % 2. While the device runs step N from one slot, the host fills the other with
step N + 1's inputs, so neither side overwrites what the other still reads. Each slot holds host
buffers (pinned on CUDA) and device buffers of static maximum size, and its own sampler outputs:
step N + 1 reads step N's sampled tokens from the other slot (carry-over).
"""

from __future__ import annotations

import numpy as np
import torch

from rollout.engine.execution.streams import StepStreams
from rollout.engine.scheduling.step_inputs import StepInputs

# name -> (dtype, which maximum bounds the buffer's element count), for every StepInputs array that
# goes to the device. Buffers are flat: a step's array is the contiguous prefix, viewed in its shape
# (a strided copy from pinned memory would be staged through pageable memory and block the host).
_INPUT_FIELDS = {
    "input_ids": (torch.int64, "tokens"),
    "positions": (torch.int64, "tokens"),
    "slot_mapping": (torch.int64, "tokens"),
    "carry_src": (torch.int64, "tokens"),
    "query_start_loc": (torch.int32, "seqs+1"),
    "seq_lens": (torch.int32, "seqs"),
    "block_tables": (torch.int32, "seqs x blocks"),
    "logits_indices": (torch.int64, "rows"),
    "row_logits": (torch.int64, "rows"),
    "temperature": (torch.float32, "rows"),
    "top_k": (torch.int64, "rows"),
    "top_p": (torch.float32, "rows"),
    "min_p": (torch.float32, "rows"),
    "keys": (torch.int64, "rows"),
    "block_copies": (torch.int64, "seqs x 2"),
    "q_block_seq": (torch.int32, "tokens"),
    "q_block_start": (torch.int32, "tokens"),
}


class StepSlot:
    def __init__(
        self,
        streams: StepStreams,
        device: torch.device,
        max_tokens: int,
        max_seqs: int,
        max_blocks_per_seq: int,
        max_rows: int,
    ) -> None:
        """`max_rows`: most tokens a step samples (one per sequence, plus verified drafts)."""
        pin = device.type == "cuda"
        self.max_blocks_per_seq = max_blocks_per_seq
        self.max_tokens, self.max_rows = max_tokens, max_rows
        sizes = {
            "tokens": max_tokens,
            "seqs": max_seqs,
            "seqs+1": max_seqs + 1,
            "rows": max_rows,
            "seqs x blocks": max_seqs * max_blocks_per_seq,
            "seqs x 2": max_seqs * 2,
        }
        # One byte buffer per side holds every field at a fixed, aligned offset, so a step's
        # inputs travel in a single copy instead of one per field.
        layout, total = {}, 0
        for name, (dtype, size) in _INPUT_FIELDS.items():
            nbytes = sizes[size] * torch.empty((), dtype=dtype).element_size()
            layout[name] = (total, nbytes, dtype)
            total += -(-nbytes // 64) * 64
        self.host_bytes = torch.zeros(total, dtype=torch.uint8, pin_memory=pin)
        self.device_bytes = torch.zeros(total, dtype=torch.uint8, device=device)
        # The host side as numpy views of the same (pinned) memory, made once: a step writes
        # every field, and a view made per field per step costs more than the write.
        self.host: dict[str, np.ndarray] = {}
        self.device: dict[str, torch.Tensor] = {}
        for name, (offset, nbytes, dtype) in layout.items():
            self.host[name] = self.host_bytes[offset : offset + nbytes].view(dtype).numpy()
            self.device[name] = self.device_bytes[offset : offset + nbytes].view(dtype)
        self.tokens_device = torch.zeros(max_rows, dtype=torch.int64, device=device)
        self.logprobs_device = torch.zeros(max_rows, dtype=torch.float32, device=device)
        self.tokens_host = torch.zeros(max_rows, dtype=torch.int64, pin_memory=pin)
        self.logprobs_host = torch.zeros(max_rows, dtype=torch.float32, pin_memory=pin)
        self.copy_in_done = streams.new_event()
        self.compute_done = streams.new_event()
        self.copy_out_done = streams.new_event()

    def fits(self, num_tokens: int, num_rows: int) -> bool:
        """Whether a step of this many tokens and sampler rows fits the slot's buffers."""
        return num_tokens <= self.max_tokens and num_rows <= self.max_rows

    def fill_host(self, inputs: StepInputs) -> dict[str, tuple[int, ...]]:
        """Write the step's arrays into the pinned host buffers; returns each array's shape."""
        shapes = {}
        for name in _INPUT_FIELDS:
            array: np.ndarray = getattr(inputs, name)
            self.host[name][: array.size] = array.reshape(-1)
            shapes[name] = array.shape
        return shapes

    def copy_to_device(self) -> None:
        """Enqueue the host-to-device copy on the current stream."""
        self.device_bytes.copy_(self.host_bytes, non_blocking=True)

    def device_views(self, shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
        """`device_view` of each named buffer."""
        return {name: self.device_view(name, shape) for name, shape in shapes.items()}

    def device_view(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """The device buffer's contiguous prefix in `shape` (the same memory every step)."""
        return self.device[name][: int(np.prod(shape))].view(shape)
