"""Weight sync: the trainer's parameters into the rollout engines, in place, between steps.

manifest.py   names, shapes, dtype and buckets of a sync; the engine's check of them
adapter_manifest.py  a LoRA adapter's sync: factors per module, scalings; the engine's check
group.py      the trainer + engines process group (TCP store; gloo or NCCL)
transfer.py   send_weights (trainer) and receive_weights / receive_into (engine), over a transport
base.py       the transport interface
broadcast.py  gloo / NCCL: one broadcast per bucket
cuda_ipc.py   trainer and engine on one GPU: the engine maps the trainer's staging buffer
"""

from rollout.weight_sync.adapter_manifest import (
    AdapterManifest,
    LoraAdapter,
    adapter_manifest_for,
    check_adapter,
)
from rollout.weight_sync.group import BACKENDS, WeightGroup, free_port
from rollout.weight_sync.manifest import (
    DEFAULT_BUCKET_BYTES,
    WeightManifest,
    check_manifest,
    manifest_for,
    manifest_from_specs,
)
from rollout.weight_sync.transfer import (
    TornWeightsError,
    receive_into,
    receive_weights,
    send_weights,
)

__all__ = [
    "AdapterManifest",
    "BACKENDS",
    "DEFAULT_BUCKET_BYTES",
    "TornWeightsError",
    "WeightGroup",
    "LoraAdapter",
    "WeightManifest",
    "adapter_manifest_for",
    "check_adapter",
    "check_manifest",
    "free_port",
    "manifest_for",
    "manifest_from_specs",
    "receive_into",
    "receive_weights",
    "send_weights",
]
