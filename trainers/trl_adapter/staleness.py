"""How old a streamed sample is, and the gate that drops the ones too old to train on.

Weights change in place while samples generate, so a long sample's tokens come from several
weight versions (`FinishedSample.token_versions`). `sample_version` reads one version for the
whole sample by the job's rule (`trainer.staleness`): its newest token's, the mean over its
tokens, or its oldest token's. Only "first_token" makes a sample's age grow with its length, which
is what drops long samples under a trainer that steps faster than they generate.
"group_last_token" gives every sample of a group the group's newest token's version: the short
siblings of a long sample, which wait finished until it ends, are not dropped for that wait.

`StalenessGate` is the queue AsyncGRPOTrainer reads samples from: a sample more than
`max_staleness` versions behind the trainer's current version when the trainer takes it is
dropped there and counted (samples, tokens), beside what was handed over, so the summary, the
console and W&B show what staleness cost. TRL's own check after it then finds nothing to drop,
except a sample taken in the instant a sync bumps the version (TRL logs that one itself).
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


def group_versions(samples: list, rule: str) -> list[float]:
    """The version of each of a group's samples (FinishedSamples) by `rule`; "group_last_token":
    every sample takes the group's newest token's version, so a group is kept or dropped whole
    (GRPO scores each sample against its group)."""
    if rule == "group_last_token":
        newest = max(
            sample_version(s.token_versions, s.weight_versions, "last_token") for s in samples
        )
        return [newest] * len(samples)
    return [sample_version(s.token_versions, s.weight_versions, rule) for s in samples]


def sample_version(
    token_versions: list[tuple[int, int]] | None, weight_versions: tuple[int, int], rule: str
) -> float:
    """The sample's weight version by `rule`; from its (start, end) versions when the per-token
    runs are unknown (a multi-turn episode: "mean_token" then takes their midpoint)."""
    if not token_versions:
        first, last = weight_versions
        return {"first_token": first, "last_token": last, "mean_token": (first + last) / 2}[rule]
    if rule == "first_token":
        return float(token_versions[0][1])
    if rule == "last_token":
        return float(token_versions[-1][1])
    if rule == "mean_token":
        tokens = sum(n for n, _ in token_versions)
        return sum(n * v for n, v in token_versions) / tokens
    raise ValueError(f"unknown staleness rule {rule!r}")


@dataclass
class _Entry:
    sample: object  # TRL's RolloutSample
    version: float
    tokens: int


@dataclass
class StalenessCounts:
    """What reached the trainer and what the gate dropped, since the start of the run."""

    generated_samples: int = 0
    generated_tokens: int = 0
    trained_samples: int = 0
    trained_tokens: int = 0
    dropped_samples: int = 0
    dropped_tokens: int = 0
    staleness_sum: float = 0.0
    """Summed over the handed-over samples' tokens: tokens x (trainer version - token version)."""

    def summary(self) -> dict:
        def mean(total: float, count: int) -> float | None:
            return total / count if count else None

        return {
            "dropped_samples": self.dropped_samples,
            "dropped_tokens": self.dropped_tokens,
            "trained_samples": self.trained_samples,
            "trained_tokens": self.trained_tokens,
            "trained_mean_length": mean(self.trained_tokens, self.trained_samples),
            "generated_mean_length": mean(self.generated_tokens, self.generated_samples),
            "staleness_per_token": mean(self.staleness_sum, self.trained_tokens),
        }


class StalenessGate(queue.Queue):
    """A queue of scored samples (`put_sample`) that drops, at the trainer's `get`, those more
    than `max_staleness` versions behind `current_version()`; `metrics` receives the counts for
    TRL's logs ("total" keys are summed per log)."""

    def __init__(
        self,
        max_staleness: int,
        current_version: Callable[[], int],
        metrics: queue.Queue | None = None,
    ) -> None:
        super().__init__()
        self.max_staleness = max_staleness
        self.current_version = current_version
        self.metrics = metrics
        self.counts = StalenessCounts()
        self._counting = threading.Lock()
        self._first_take: tuple[int, int] | None = None  # (trainer version, samples taken then)

    def put_sample(self, sample, version: float, tokens: int) -> None:
        """`version`: the sample's version by the job's rule; `tokens`: its completion tokens."""
        with self._counting:
            self.counts.generated_samples += 1
            self.counts.generated_tokens += tokens
        self.put(_Entry(sample, version, tokens))

    def get(self, block: bool = True, timeout: float | None = None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            entry: _Entry = super().get(block, left)
            current = self.current_version()
            age = current - entry.version
            if age <= self.max_staleness:
                if self._first_take is None:
                    self._first_take = (current, self.counts.trained_samples)
                self._count(entry, dropped=False, age=age)
                return entry.sample
            self._count(entry, dropped=True, age=age)

    def samples_per_version(self) -> float | None:
        """How many samples the trainer takes per weight version, on average since its first
        take (None until its version has moved on from that one)."""
        if self._first_take is None:
            return None
        version, taken = self._first_take
        versions = self.current_version() - version
        if versions < 1:
            return None
        return (self.counts.trained_samples - taken) / versions

    def admits(self, group_size: int, in_flight: int, max_staleness: int) -> bool:
        """Bounded admission: whether a new group of `group_size` samples, behind the queued
        samples and `in_flight` generating ones, would reach the trainer within `max_staleness`
        versions at the trainer's pace (those ahead are taken first). Always when nothing is
        ahead, and until the pace is known."""
        ahead = self.qsize() + in_flight
        rate = self.samples_per_version()
        if ahead == 0 or rate is None:
            return True
        return ahead + group_size <= (max_staleness + 1) * rate

    def _count(self, entry: _Entry, dropped: bool, age: float) -> None:
        with self._counting:
            c = self.counts
            if dropped:
                c.dropped_samples += 1
                c.dropped_tokens += entry.tokens
            else:
                c.trained_samples += 1
                c.trained_tokens += entry.tokens
                c.staleness_sum += age * entry.tokens
        if self.metrics is None:
            return
        if dropped:
            self.metrics.put(
                {
                    "rollout/dropped_samples_total": 1.0,
                    "rollout/dropped_tokens_total": float(entry.tokens),
                    "rollout/dropped_length": float(entry.tokens),
                }
            )
        else:
            self.metrics.put(
                {"rollout/trained_length": float(entry.tokens), "rollout/sample_staleness": age}
            )


def trl_version(version: float) -> int:
    """The integer version TRL's own staleness check reads: rounded down, so TRL never finds a
    sample older than the gate did (current - floor(v) <= max exactly when current - v <= max)."""
    return math.floor(version)
