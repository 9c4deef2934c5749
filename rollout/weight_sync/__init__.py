"""Weight sync: the trainer's parameters into the rollout engines, in place, between steps.

manifest.py   names, shapes, dtype and buckets of a sync; the engine's check of them
group.py      the trainer + engines process group (TCP store; gloo or NCCL)
transfer.py   send_weights (trainer) and receive_weights (engine), over a transport
base.py       the transport interface
broadcast.py  gloo / NCCL: one broadcast per bucket
cuda_ipc.py   trainer and engine on one GPU: the engine maps the trainer's staging buffer
"""

from rollout.weight_sync.group import BACKENDS, WeightGroup, free_port
from rollout.weight_sync.manifest import (
    DEFAULT_BUCKET_BYTES,
    WeightManifest,
    check_manifest,
    manifest_for,
)
from rollout.weight_sync.transfer import TornWeightsError, receive_weights, send_weights

__all__ = [
    "BACKENDS",
    "DEFAULT_BUCKET_BYTES",
    "TornWeightsError",
    "WeightGroup",
    "WeightManifest",
    "check_manifest",
    "free_port",
    "manifest_for",
    "receive_weights",
    "send_weights",
]
