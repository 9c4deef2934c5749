"""The key of each sampled token: a hash of (request seed, sample index, output position).

The sampler hashes this key with each vocabulary index into its noise
(`rollout.engine.execution.sampler`), so a token depends only on its own request. The key is
built on the host with the step's other inputs; the device only mixes it further with the same
32-bit hash.
"""

from __future__ import annotations

import numpy as np

MASK32 = 0xFFFFFFFF


def mix32_host(x: np.ndarray) -> np.ndarray:
    """The sampler's 32-bit integer hash, on host arrays (values taken modulo 2^32)."""
    x = x.astype(np.uint64) & np.uint64(MASK32)
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x7FEB352D)) & np.uint64(MASK32)
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(0x5BD1E995)) & np.uint64(MASK32)
    return x ^ (x >> np.uint64(16))


def sample_keys(seeds: np.ndarray, sample_indices: np.ndarray) -> np.ndarray:
    """The part of a token's key a sample keeps for its life: (seed, sample index) hashed, as
    uint64 below 2^32. `Sequence.sample_key` holds it, so a step hashes only the positions."""
    seeds = seeds.astype(np.uint64)
    # Chained, not symmetric: the low and high halves of a seed cannot trade places.
    key = mix32_host(seeds & np.uint64(MASK32))
    key = mix32_host(((key + np.uint64(0x632BE5AB)) & np.uint64(MASK32)) ^ (seeds >> np.uint64(32)))
    return mix32_host(key ^ mix32_host(sample_indices.astype(np.uint64) + np.uint64(0x9E37)))


def token_keys(sample_keys: np.ndarray, output_positions: np.ndarray) -> np.ndarray:
    """One 32-bit key per sampled token from its sample's key and output position, as int64."""
    positions = output_positions.astype(np.uint64) + np.uint64(0x85EB)
    return mix32_host(sample_keys.astype(np.uint64) ^ mix32_host(positions)).astype(np.int64)


def row_keys(
    seeds: np.ndarray, sample_indices: np.ndarray, output_positions: np.ndarray
) -> np.ndarray:
    """One 32-bit key per sampled token from (seed, sample index, output position), as int64."""
    return token_keys(sample_keys(seeds, sample_indices), output_positions)
