"""Checkpoints a run can resume from, and the rollout side's part of them.

transformers' Trainer writes `<output_dir>/checkpoint-<step>/` with the model, optimizer,
scheduler, step and RNG states, and restores them on `train(resume_from_checkpoint=...)`. The
rollout side adds `rollout_state.json`: the dataset position of the first prompt not yet trained
on, the weight version, and the W&B run id, so a resumed run generates from where it stopped,
under the same version numbers (staleness stays right), logging into the same W&B run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROLLOUT_STATE = "rollout_state.json"
WANDB_RUN_ID = "wandb_run_id.txt"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def checkpoints(out: Path) -> list[Path]:
    """The checkpoint folders under `out`, oldest step first."""
    found = [
        (int(m.group(1)), p) for p in out.glob("checkpoint-*") if (m := _CHECKPOINT.match(p.name))
    ]
    return [p for _, p in sorted(found)]


def resolve_resume(setting: str | None, out: Path) -> Path | None:
    """The checkpoint `trainer.resume_from_checkpoint` names: "latest" (the newest under
    output_dir), a folder, or None. A name that finds nothing is an error that says so."""
    from trainers.job.preflight import JobInputError

    if setting is None:
        return None
    if setting == "latest":
        found = [p for p in checkpoints(out) if (p / "trainer_state.json").is_file()]
        if not found:
            raise JobInputError(
                f"trainer.resume_from_checkpoint=latest: no checkpoint under {out}; start "
                "without it, or set output_dir to the run to resume"
            )
        return found[-1]
    path = Path(setting).expanduser()
    if not (path / "trainer_state.json").is_file():
        raise JobInputError(
            f"trainer.resume_from_checkpoint={setting}: not a checkpoint folder (no "
            "trainer_state.json); give a checkpoint-<step> folder, or latest"
        )
    return path


def read_rollout_state(checkpoint: Path | None) -> dict[str, Any]:
    """What the rollout side saved with a checkpoint ({} for a fresh start)."""
    if checkpoint is None:
        return {}
    path = checkpoint / ROLLOUT_STATE
    return json.loads(path.read_text()) if path.is_file() else {}


def wandb_run_id(out: Path) -> str:
    """This run's W&B id, made on the first start and kept in the output directory, so a
    resumed run logs into the same W&B run."""
    path = out / WANDB_RUN_ID
    if path.is_file():
        return path.read_text().strip()
    import uuid

    run_id = uuid.uuid4().hex[:12]
    path.write_text(run_id)
    return run_id


def rollout_state_callback(rollout_state: Any):
    """A TrainerCallback that writes `rollout_state()` into each checkpoint as it is saved, and
    times each save (from the step's end to the saved folder, the step's log included) and
    measures its size: `saves` holds (step, seconds, GiB)."""
    import time

    from transformers import TrainerCallback

    class RolloutStateCallback(TrainerCallback):
        def __init__(self) -> None:
            self.saves: list[tuple[int, float, float]] = []
            self._step_end = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self._step_end = time.perf_counter()

        def on_save(self, args, state, control, **kwargs):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if not folder.is_dir():
                return
            (folder / ROLLOUT_STATE).write_text(json.dumps(rollout_state(), indent=1))
            size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
            seconds = time.perf_counter() - self._step_end
            self.saves.append((state.global_step, round(seconds, 2), round(size / 2**30, 3)))

    return RolloutStateCallback()
