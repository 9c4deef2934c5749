"""Stop strings: whether a sample's decoded output now contains one of its `params.stop`.

Checked on the host after each new token, for samples that have stop strings only. A string of
L characters spans at most L tokens, plus a few that decode to nothing or to half a character,
so only the last L + 4 output tokens are decoded: the cost per token does not grow with the
sample's length. Only the output is searched (a stop string in the prompt does not count).
"""

from __future__ import annotations

from rollout.engine.scheduling.sequence import PLACEHOLDER, Sequence

_SLACK_TOKENS = 4


class StopStrings:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def hit(self, seq: Sequence) -> bool:
        stops = seq.params.stop
        window = max(len(s) for s in stops) + _SLACK_TOKENS
        start = max(seq.num_prompt_tokens, len(seq.token_ids) - window)
        tail = [t for t in seq.token_ids[start:] if t != PLACEHOLDER]
        text = self.tokenizer.decode(tail, skip_special_tokens=False)
        return any(s in text for s in stops)
