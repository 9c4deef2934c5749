"""The groups one rollout worker is generating, and the FinishedSample each of their samples
ends as: one builder for a plain sample (an engine Completion) and a multi-turn one (an Episode,
which carries the same fields and its episode's mask, reward, status and turns)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rollout.actors.messages import FinishedSample, GroupRequest
from rollout.engine.scheduling.sequence import Completion
from rollout.environments.episodes import Episode


@dataclass
class _InFlight:
    request: GroupRequest
    received_at: float
    """Wall-clock time (time.time()) the worker took the group."""
    version: int
    """The weight version when the group started."""
    remaining: int
    """Samples not finished yet."""
    updates: list[tuple[int, dict[int, int]]] = field(default_factory=list)
    """Each weight update since the group started: (its version, {sample index: tokens the
    sample had generated before it})."""


class GroupsInFlight:
    def __init__(self, worker_id: int) -> None:
        self.worker_id = worker_id
        self._groups: dict[str, _InFlight] = {}  # by engine request id (str(group_id))

    def __len__(self) -> int:
        return len(self._groups)

    def add(self, group: GroupRequest, version: int) -> str:
        """Start tracking a group; returns its request id in the engine."""
        request_id = str(group.group_id)
        self._groups[request_id] = _InFlight(group, time.time(), version, group.params.n)
        return request_id

    def weights_changed(self, version: int, output_lengths: dict[str, dict[int, int]]) -> None:
        """A weight update to `version` landed; `output_lengths` (LLMEngine.output_lengths, read
        at the same step boundary) says how far each sample had got under the old weights."""
        for request_id, group in self._groups.items():
            group.updates.append((version, output_lengths.get(request_id, {})))

    def finished(
        self, request_id: str, ended: Completion | Episode, version: int, now: float
    ) -> FinishedSample:
        """The FinishedSample of one of the group's samples, finished under weight `version`;
        the group is done with its last."""
        group = self._groups[request_id]
        episode = ended if isinstance(ended, Episode) else None
        sample = FinishedSample(
            group_id=group.request.group_id,
            attempt=group.request.attempt,
            sample_index=ended.index,
            prompt_token_ids=ended.prompt_token_ids,
            token_ids=ended.token_ids,
            logprobs=ended.logprobs,
            finish_reason=ended.finish_reason,
            error=ended.error,
            weight_versions=(group.version, version),
            actor=self.worker_id,
            received_at=group.received_at,
            finished_at=now,
            queue_wait_s=ended.queue_wait_s,
            completion_mask=episode.completion_mask if episode else None,
            reward=episode.reward if episode else None,
            episode_status=episode.status if episode else None,
            num_turns=episode.num_turns if episode else 0,
            routes=None if episode else ended.routes,
            token_versions=(
                None
                if episode
                else token_versions(group.version, group.updates, ended.index, len(ended.token_ids))
            ),
        )
        group.remaining -= 1
        if group.remaining == 0:
            del self._groups[request_id]
        return sample


def token_versions(
    start: int, updates: list[tuple[int, dict[int, int]]], index: int, length: int
) -> list[tuple[int, int]]:
    """Run-length (tokens, version) of sample `index`'s `length` tokens: it started under
    `start`, and each update (version, {index: tokens before it}) switched the rest."""
    runs: list[tuple[int, int]] = []
    version, done = start, 0
    for new_version, lengths in updates:
        upto = min(lengths.get(index, 0), length)
        if upto > done:
            runs.append((upto - done, version))
            done = upto
        version = new_version
    if length > done:
        runs.append((length - done, version))
    return runs
