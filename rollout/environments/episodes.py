"""Multi-turn episodes over one LLMEngine: model turns are engine requests, environment calls run
on other threads.

A group's G episodes start from one prompt (the first environment's reset), sent as one request
with n = G so the samples share its blocks. When a model turn ends (a stop string such as a tool
call's closing tag, EOS, or its token budget), its text goes to that episode's `env.step` on a
thread pool (or, for `async def step`, on an event loop thread) while the engine serves every
other sample. The observation that comes back is tokenized and appended, and the next turn is a
new request over the whole conversation: the engine's prefix cache finds the blocks the last
turn computed, so only the last partial block and the appended tokens are computed again.

Each episode ends as one sample: the completion is every token after the first prompt, the
mask is 1 on the model's tokens and 0 on the environment's, and the logprobs are the model's
(0.0 on the environment's tokens). Statuses: "done" (the environment said so, with its reward),
"max_turns", "max_tokens" (limits: no reward), "tool_error: ..." and "tool_timeout" (the
environment failed: an error sample, never trained on), "abort", or the engine's error.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from rollout.engine.sampling_params import SamplingParams
from rollout.engine.scheduling.sequence import Completion
from rollout.engine.seeds import episode_seeds, turn_seed
from rollout.environments.base import EpisodeLimits, StepResult, load_environment
from rollout.prompts import PromptFormatter


@dataclass
class Episode:
    group_key: str
    index: int
    env: Any
    seed: int
    prompt_token_ids: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    completion_mask: list[int] = field(default_factory=list)
    """1 on the model's tokens, 0 on the environment's."""
    logprobs: list[float] = field(default_factory=list)
    num_turns: int = 0
    status: str | None = None
    reward: float | None = None
    error: str | None = None
    queue_wait_s: float = 0.0
    pending: Future | None = None
    """The environment call in flight (reset or step)."""
    deadline: float = 0.0

    @property
    def finish_reason(self) -> str:
        if self.status == "done":
            return "stop"
        if self.status in ("max_turns", "max_tokens"):
            return "length"
        if self.status == "abort":
            return "abort"
        return "error"


@dataclass
class _Group:
    key: str
    params: SamplingParams
    limits: EpisodeLimits
    stop: tuple[str, ...]
    episodes: list[Episode]
    started: bool = False
    """The first turn went to the engine (after every reset came back)."""


class EpisodeRunner:
    """Drives the episodes of many groups on one engine; call its methods from the engine's
    thread. `wake` is called (from any thread) when an environment call finishes."""

    def __init__(self, engine, wake: Callable[[], None]) -> None:
        if engine.tokenizer is None:
            raise ValueError("multi-turn episodes need an engine with a tokenizer")
        self.engine = engine
        self.formatter = PromptFormatter(engine.tokenizer)
        self.wake = wake
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(
            target=self._loop.run_forever, name="env-async", daemon=True
        )
        self._loop_thread.start()
        self._groups: dict[str, _Group] = {}
        self._requests: dict[str, tuple[str, dict[int, int]]] = {}
        """engine request id -> (group key, the episodes of its samples not back yet, by the
        sample's index in the request)."""
        self.finished: list[Episode] = []
        """Ended episodes; the worker takes them."""

    # ---- from the worker -------------------------------------------------------------------

    def start(
        self, key: str, environment: str, row: dict, params: SamplingParams, limits: EpisodeLimits
    ) -> None:
        """Start a group of params.n episodes of `environment` on dataset row `row`."""
        env_class = load_environment(environment)
        seeds = episode_seeds(self.engine.config.seed, key, params.n, params.seed)
        episodes = [Episode(key, i, env_class(), seed) for i, seed in enumerate(seeds)]
        stop = tuple(getattr(env_class, "stop", ())) + tuple(params.stop)
        group = _Group(key, params, limits, stop, episodes)
        self._groups[key] = group
        for episode in episodes:
            self._call(episode, episode.env.reset, row, limits)

    def owns(self, request_id: str) -> bool:
        return request_id in self._requests

    def on_completion(self, c: Completion) -> None:
        """A model turn ended: record its tokens and hand its text to the environment."""
        key, waiting = self._requests[c.request_id]
        index = waiting.pop(c.index)  # the episode of the request's sample c.index
        if not waiting:
            del self._requests[c.request_id]
        group = self._groups.get(key)
        if group is None:
            return  # the group was aborted and has ended
        episode = group.episodes[index]
        if episode.status is not None:
            return  # aborted meanwhile
        if episode.num_turns == 0:
            episode.queue_wait_s = c.queue_wait_s
        if c.finish_reason in ("error", "abort"):
            self._end(episode, c.finish_reason if c.finish_reason == "abort" else "engine_error",
                      error=c.error)  # fmt: skip
            return
        episode.token_ids += c.token_ids
        episode.completion_mask += [1] * len(c.token_ids)
        episode.logprobs += c.logprobs
        episode.num_turns += 1
        text = self.engine.tokenizer.decode(c.token_ids, skip_special_tokens=True)
        self._call(episode, episode.env.step, text, group.limits)

    def poll(self) -> None:
        """Apply finished environment calls: next turns go to the engine, ended episodes to
        `finished`. Calls past their time limit end their episode."""
        now = time.monotonic()
        for group in list(self._groups.values()):
            for episode in group.episodes:
                future = episode.pending
                if future is None:
                    continue
                if future.done():
                    episode.pending = None
                    self._apply(group, episode, future)
                elif now > episode.deadline:
                    future.cancel()  # stops an async call; a thread runs on, its result unused
                    episode.pending = None
                    self._end(episode, "tool_timeout", error=(
                        f"the environment took over {group.limits.tool_timeout_s} s"))  # fmt: skip
            self._start_first_turn(group)
            if all(e.status is not None for e in group.episodes):
                del self._groups[group.key]

    def abort(self, key: str) -> None:
        group = self._groups.get(key)
        if group is None:
            return
        for request_id, (owner, _) in list(self._requests.items()):
            if owner == key:
                self.engine.abort(request_id)
        for episode in group.episodes:
            if episode.status is None:
                if episode.pending is not None:
                    episode.pending.cancel()
                    episode.pending = None
                self._end(episode, "abort")

    @property
    def busy(self) -> bool:
        """Episodes are under way (perhaps only waiting for their environments)."""
        return bool(self._groups)

    def next_deadline_s(self) -> float | None:
        deadlines = [e.deadline for g in self._groups.values() for e in g.episodes if e.pending]
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def shutdown(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)

    # ---- internals -------------------------------------------------------------------------

    def _call(self, episode: Episode, fn: Callable, arg: Any, limits: EpisodeLimits) -> None:
        if inspect.iscoroutinefunction(fn):
            future = asyncio.run_coroutine_threadsafe(fn(arg), self._loop)
        else:
            future = _in_a_thread(fn, arg)
        future.add_done_callback(lambda _: self.wake())
        episode.pending = future
        episode.deadline = time.monotonic() + limits.tool_timeout_s

    def _apply(self, group: _Group, episode: Episode, future: Future) -> None:
        if episode.status is not None:
            return
        try:
            result = future.result()
        except BaseException as err:  # noqa: BLE001 - the environment's failure ends its episode
            self._end(episode, "tool_error", error=f"{type(err).__name__}: {err}")
            return
        if episode.num_turns == 0:  # reset: the first prompt
            try:
                episode.prompt_token_ids = self.formatter.prompt_ids(result)
            except Exception as err:  # noqa: BLE001 - the environment's reset gave no prompt
                self._end(episode, "tool_error", error=(
                    f"reset() returned {type(result).__name__}, not a prompt (text or chat "
                    f"messages): {err}"))  # fmt: skip
            return
        if not isinstance(result, StepResult) or not isinstance(result.observation, str):
            self._end(episode, "tool_error", error=(
                f"step() returned {type(result).__name__}, not a StepResult with a text "
                "observation"))  # fmt: skip
            return
        if result.done:
            self._end(episode, "done", reward=float(result.reward))
            return
        if episode.num_turns >= group.limits.max_turns:
            self._end(episode, "max_turns")
            return
        observation = self.engine.tokenizer(result.observation, add_special_tokens=False)
        observation_ids = list(observation["input_ids"])
        if len(episode.token_ids) + len(observation_ids) + 1 > group.limits.max_tokens:
            self._end(episode, "max_tokens")
            return
        episode.token_ids += observation_ids
        episode.completion_mask += [0] * len(observation_ids)
        episode.logprobs += [0.0] * len(observation_ids)
        self._submit(group, [episode], episode.prompt_token_ids + episode.token_ids)

    def _start_first_turn(self, group: _Group) -> None:
        """Once every reset is back: one request for the group when the prompts agree (they
        share its blocks), else one per episode."""
        if group.started:
            return
        waiting = [e for e in group.episodes if e.status is None]
        if any(e.pending is not None for e in waiting):
            return
        group.started = True
        if len({tuple(e.prompt_token_ids) for e in waiting}) == 1:
            self._submit(group, waiting, waiting[0].prompt_token_ids)
        else:
            for episode in waiting:
                self._submit(group, [episode], episode.prompt_token_ids)

    def _submit(self, group: _Group, episodes: list[Episode], prompt_ids: list[int]) -> None:
        first = episodes[0]
        room = min(group.params.max_tokens, group.limits.max_tokens - len(first.token_ids))
        params = dataclasses.replace(
            group.params,
            n=len(episodes),
            max_tokens=max(1, room),
            stop=group.stop,
            seed=turn_seed(first.seed, first.num_turns),
        )
        request_id = f"{group.key}/{first.index}/{first.num_turns}"
        self._requests[request_id] = (group.key, {j: e.index for j, e in enumerate(episodes)})
        self.engine.add_request(prompt_ids, params, request_id=request_id)

    def _end(self, episode: Episode, status: str, reward: float | None = None,
             error: str | None = None) -> None:  # fmt: skip
        episode.status = status
        episode.reward = reward
        episode.error = error if error is None else f"{status}: {error}"
        self.finished.append(episode)


def _in_a_thread(fn: Callable, arg: Any) -> Future:
    """Run fn(arg) on a daemon thread of its own: a call that never returns is abandoned at its
    time limit and cannot keep the process alive (a thread pool's workers would be joined at
    exit)."""
    future: Future = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn(arg))
        except BaseException as err:  # noqa: BLE001 - handed to the episode through the future
            future.set_exception(err)

    threading.Thread(target=run, name="env-call", daemon=True).start()
    return future
