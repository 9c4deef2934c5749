"""Benchmark mode: each sample's length drawn in advance from a stated distribution.

A model with random weights rarely ends a sample on its own, so a job measuring what streaming
does with long samples (staleness, drops, length bias) plans their lengths instead: a lognormal
of the given median and sigma, clipped to [min, max] and rounded, one draw per sample, seeded.
The samples ignore EOS and end at their planned length (`SamplingParams.sample_lengths`).
"""

from __future__ import annotations

import dataclasses
import math

from rollout.engine.sampling_params import SamplingParams


class PlannedLengths:
    def __init__(self, median: float, sigma: float, min: int, max: int, seed: int = 0) -> None:
        import numpy as np

        self.median, self.sigma, self.low, self.high = median, sigma, min, max
        self._rng = np.random.default_rng(seed)

    def params_for(self, sampling: SamplingParams) -> SamplingParams:
        """`sampling` for one group, each of its n samples with its own drawn length."""
        draws = self._rng.lognormal(math.log(self.median), self.sigma, size=sampling.n)
        lengths = tuple(int(min(max(round(x), self.low), self.high)) for x in draws)
        return dataclasses.replace(sampling, sample_lengths=lengths, ignore_eos=True)


def planned_lengths(settings) -> PlannedLengths | None:
    """From the job's `rollout.planned_lengths` (checked by the config; None: off)."""
    if settings is None:
        return None
    return PlannedLengths(
        settings.median, settings.sigma, settings.min, settings.max, settings.seed
    )
