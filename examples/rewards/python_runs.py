"""An example of an ``async def`` reward: does the completion's Python code run?

Async suits a reward that waits on something outside the process (a sandbox, a judge model, a
web service): here every completion of the group runs at once, in its own Python subprocess,
instead of one after another. The trainer runs an async reward to completion on each call.

    rewards: [exact_answer, examples/rewards/python_runs.py:python_runs]
    reward_weights: [1.0, 0.5]

This runs code the model wrote on the training machine, with only a timeout and Python's
isolated mode (-I) around it: fine for a demo, but give it a real sandbox (a container without
network or secrets) before training on it.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Sequence
from typing import Any

TIMEOUT_S = 5.0
"""Code still running after this long scores 0.0 (an endless loop must not stall a step)."""

_CODE_BLOCK = re.compile(r"```(?:python|py)\s*\n(.*?)```", re.DOTALL | re.IGNORECASE)


async def python_runs(
    prompts: Sequence[Any], completions: Sequence[Any], **columns: Any
) -> list[float | None]:
    """1.0 if the completion's last ```python block exits cleanly, 0.0 if it fails or times out,
    None (no reward for this sample, as TRL allows) if the completion has no such block."""
    return list(await asyncio.gather(*(_score(_text(c)) for c in completions)))


async def _score(text: str) -> float | None:
    blocks = _CODE_BLOCK.findall(text)
    if not blocks:
        return None
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        "-c",
        blocks[-1],
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        code = await asyncio.wait_for(process.wait(), TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()  # reaped, so no zombie outlives the step
        return 0.0
    return 1.0 if code == 0 else 0.0


def _text(completion: str | Sequence[dict[str, Any]]) -> str:
    # A chat completion is a list of messages; the model's reply is the last one's content.
    if isinstance(completion, str):
        return completion
    return str(completion[-1].get("content") or "") if completion else ""
