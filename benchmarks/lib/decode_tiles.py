"""`--decode-tiles KEY=INT`: a benchmark's change to the decode attention's launch shape
(`triton_decode_attention.DecodeTiles`), made before any CUDA graph captures the kernel."""

from __future__ import annotations

import dataclasses


def set_decode_tiles(pairs: list[str]) -> dict:
    """Apply KEY=VALUE (ints) to the decode kernel's DECODE_TILES; returns the fields in use.
    An unknown field or a value that is not an integer ends the run before any work."""
    from rollout.kernels import triton_decode_attention as decode

    fields = {f.name for f in dataclasses.fields(decode.DecodeTiles)}
    changes = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key not in fields or not value.lstrip("-").isdigit():
            raise SystemExit(f"--decode-tiles {pair!r}: KEY=INT with KEY one of {sorted(fields)}")
        changes[key] = int(value)
    try:
        decode.DECODE_TILES = dataclasses.replace(decode.DECODE_TILES, **changes)
    except ValueError as err:
        raise SystemExit(f"--decode-tiles: {err}") from None
    return vars(decode.DECODE_TILES)
