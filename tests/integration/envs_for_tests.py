"""Environments the episode tests load by name ("tests.integration.envs_for_tests:Name")."""

from __future__ import annotations

import asyncio
import time

from rollout.environments import StepResult


class TwoToolCalls:
    """Two tool outputs, then done with reward 0.5 (every model turn ends at its token budget)."""

    def reset(self, row: dict) -> str:
        self.turn = 0
        return row.get("prompt", "w5 w6 w7")

    def step(self, model_text: str) -> StepResult:
        self.turn += 1
        if self.turn <= 2:
            return StepResult(observation=f"w{10 + self.turn} w{40 + self.turn}")  # not "w2": EOS
        return StepResult(done=True, reward=0.5)


class SlowFirstEpisode(TwoToolCalls):
    """Episode tools take 1.5 s when the row says so."""

    def reset(self, row: dict) -> str:
        self.slow = row.get("slow", False)
        return super().reset(row)

    def step(self, model_text: str) -> StepResult:
        if self.slow:
            time.sleep(1.5)
        return super().step(model_text)


class Raises(TwoToolCalls):
    def step(self, model_text: str) -> StepResult:
        raise ConnectionError("the tool's server is down")


class NeverEnds(TwoToolCalls):
    def step(self, model_text: str) -> StepResult:
        time.sleep(60)
        return StepResult(done=True)


class AsyncTool(TwoToolCalls):
    async def step(self, model_text: str) -> StepResult:
        await asyncio.sleep(0.05)
        return TwoToolCalls.step(self, model_text)


class AsyncNeverEnds(TwoToolCalls):
    async def step(self, model_text: str) -> StepResult:
        await asyncio.sleep(60)
        return StepResult(done=True)


class NeverDone(TwoToolCalls):
    def step(self, model_text: str) -> StepResult:
        return StepResult(observation="w30 w31 w32")


class ReturnsNone(TwoToolCalls):
    def step(self, model_text: str):
        return None


class ResetReturnsNone(TwoToolCalls):
    def reset(self, row: dict):
        return None
