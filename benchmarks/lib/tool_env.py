"""A synthetic tool environment for benchmarks: fixed turns, tool latency from a distribution.

It works on token ids written as text ("12 7 301"), with `IdTokenizer`, so it runs on
random-weight models that have no tokenizer. Configure it through `SETTINGS` before the run.
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from rollout.environments import StepResult

SETTINGS = {
    "turns": 4,  # model turns per episode
    "observation_tokens": 64,  # tokens a tool call returns
    "latency_median_s": 0.5,  # lognormal tool latency
    "latency_sigma": 1.0,
    "vocab": 16000,
    "seed": 0,
}
_instances = itertools.count()


class IdTokenizer:
    """Text is token ids separated by spaces: decode and encode are exact inverses."""

    eos_token_id = None

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return " ".join(str(int(i)) for i in ids)

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [int(t) for t in text.split()]}


class SyntheticToolEnv:
    """Each model turn is followed by a tool call that sleeps a lognormal latency and returns
    `observation_tokens` random ids, until `turns` model turns are done (reward 1)."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng((SETTINGS["seed"], next(_instances)))
        self.turn = 0
        self.latencies: list[float] = []

    def reset(self, row: dict) -> str:
        return row["prompt"]

    def step(self, model_text: str) -> StepResult:
        self.turn += 1
        if self.turn >= SETTINGS["turns"]:
            return StepResult(done=True, reward=1.0)
        latency = SETTINGS["latency_median_s"] * float(
            np.exp(self.rng.normal(0, SETTINGS["latency_sigma"]))
        )
        time.sleep(latency)
        self.latencies.append(latency)
        ids = self.rng.integers(0, SETTINGS["vocab"], SETTINGS["observation_tokens"])
        return StepResult(observation=" ".join(str(int(i)) for i in ids))
