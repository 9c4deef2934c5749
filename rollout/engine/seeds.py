"""Seeds for requests that bring none, derived from `EngineConfig.seed`: reproducible across runs.

A seed keys its request's sampling noise (execution/sampler.py), so a sample's noise depends only
on its seed, never on what else runs. Plain requests take theirs from their arrival order in the
engine; a multi-turn group's episodes from the group's key, and each of their turns from its
episode's seed, so an episode's tokens do not depend on what the other groups do. (crc32, not
hash(): Python salts string hashes per process.)
"""

from __future__ import annotations

import zlib

_ENGINE_STRIDE = 1_000_003
_STRIDE = 7_919
_TURN_STRIDE = 104_729
_SEED_SPACE = 1 << 62


def request_seed(engine_seed: int, arrival: int) -> int:
    """The seed of the engine's `arrival`-th request."""
    return (engine_seed * _ENGINE_STRIDE + arrival * _STRIDE + 1) % _SEED_SPACE


def episode_seeds(
    engine_seed: int, group_key: str, num_episodes: int, seed: int | None = None
) -> list[int]:
    """The seeds of a multi-turn group's episodes, one each, spread from the group's `seed` (or,
    without one, from the engine's seed and the group's key)."""
    base = seed
    if base is None:
        base = (engine_seed * _ENGINE_STRIDE + zlib.crc32(group_key.encode())) % _SEED_SPACE
    return [base + _STRIDE * i for i in range(num_episodes)]


def turn_seed(episode_seed: int, turn: int) -> int:
    """The seed of an episode's `turn`-th model turn (each turn is a request of its own)."""
    return (episode_seed + _TURN_STRIDE * turn) % _SEED_SPACE
