"""Per-request sampling parameters."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one prompt's completions.

    `temperature=0` is greedy decoding; its logprobs are those of the raw distribution. Otherwise the
    returned logprob of a token is `log_softmax(logits / temperature)` at that token: the distribution
    after temperature but before top-k/top-p/min-p filtering, which is what a GRPO trainer recomputes.
    """

    max_tokens: int = 16
    """Most tokens to generate per sample (EOS/stop token included)."""
    temperature: float = 1.0
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p (1 = off)."""
    top_k: int = 0
    """Keep the k most likely tokens (0 = off)."""
    min_p: float = 0.0
    """Drop tokens whose probability is below min_p times the most likely one's (0 = off)."""
    n: int = 1
    """Samples per prompt; they share the prompt's KV blocks."""
    seed: int | None = None
    """The noise a token is drawn with hashes (seed, sample index, position, vocabulary index),
    whatever else runs in the batch (None = engine seed). On a GPU the batch's size picks the
    kernels' tiles and splits, so the logits, and with them a near-tie, may differ in their last
    bits between batches."""
    stop_token_ids: tuple[int, ...] = ()
    """Extra token ids that end a sample (included in its tokens), besides EOS."""
    ignore_eos: bool = False
    """Keep generating past EOS (benchmarks); stop_token_ids and stop still stop."""
    stop: tuple[str, ...] = ()
    """Strings that end a sample once its decoded output contains one (the tokens that made it
    are kept): a tool call's closing tag, say. Needs an engine with a tokenizer."""
    sample_lengths: tuple[int, ...] | None = None
    """Most tokens of each of the n samples, by sample (each <= max_tokens): with ignore_eos, a
    benchmark's planned lengths, since random weights rarely end a sample on their own."""

    def __post_init__(self) -> None:
        _require(
            _is_int(self.max_tokens) and self.max_tokens >= 1,
            "max_tokens",
            "must be an int >= 1",
            self.max_tokens,
        )
        _require(
            _is_number(self.temperature) and self.temperature >= 0,
            "temperature",
            "must be >= 0 (0 = greedy)",
            self.temperature,
        )
        _require(
            _is_number(self.top_p) and 0 < self.top_p <= 1, "top_p", "must be in (0, 1]", self.top_p
        )
        _require(
            _is_int(self.top_k) and self.top_k >= 0,
            "top_k",
            "must be an int >= 0 (0 = off)",
            self.top_k,
        )
        _require(
            _is_number(self.min_p) and 0 <= self.min_p <= 1,
            "min_p",
            "must be in [0, 1]",
            self.min_p,
        )
        _require(_is_int(self.n) and self.n >= 1, "n", "must be an int >= 1", self.n)
        _require(
            self.seed is None or (_is_int(self.seed) and 0 <= self.seed < 2**63),
            "seed",
            "must be None or an int in [0, 2**63)",
            self.seed,
        )
        stop = tuple(self.stop_token_ids)
        _require(
            all(_is_int(t) and t >= 0 for t in stop),
            "stop_token_ids",
            "must hold ints >= 0",
            self.stop_token_ids,
        )
        object.__setattr__(self, "stop_token_ids", stop)
        stop_strings = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        _require(
            all(isinstance(s, str) and s for s in stop_strings),
            "stop",
            "must hold non-empty strings",
            self.stop,
        )
        object.__setattr__(self, "stop", stop_strings)
        if self.sample_lengths is not None:
            lengths = tuple(self.sample_lengths)
            _require(
                len(lengths) == self.n
                and all(_is_int(x) and 1 <= x <= self.max_tokens for x in lengths),
                "sample_lengths",
                f"must hold n={self.n} ints in [1, max_tokens={self.max_tokens}]",
                self.sample_lengths,
            )
            object.__setattr__(self, "sample_lengths", lengths)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _require(ok: bool, field: str, rule: str, value: object) -> None:
    if not ok:
        raise ValueError(f"SamplingParams.{field} {rule}; got {value!r}")
