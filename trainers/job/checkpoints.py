"""The rollout side's part of each checkpoint, and the marker that makes a checkpoint complete.

transformers' Trainer writes `<output_dir>/checkpoint-<step>/` with the model, optimizer,
scheduler, step and RNG states, and restores them on `train(resume_from_checkpoint=...)`. The
rollout side adds `rollout_state.json`: the dataset position of the first prompt not yet trained
on, the weight version, and the W&B run id, so a resumed run generates from where it stopped,
under the same version numbers (staleness stays right), logging into the same W&B run.

Transformers writes the folder itself before the callbacks run, so the folder cannot be renamed
into place whole; instead `checkpoint_complete.json` is written last, after the rollout state,
listing every file of the checkpoint with its size. Invariant: a checkpoint is complete iff its
marker lists files that are all there at their recorded sizes; a folder without the marker is a
save that did not finish (trainers.job.resume checks this before a run resumes from it).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

ROLLOUT_STATE = "rollout_state.json"
MARKER = "checkpoint_complete.json"
WANDB_RUN_ID = "wandb_run_id.txt"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def checkpoints(out: Path) -> list[Path]:
    """The checkpoint folders under `out`, complete or not, oldest step first."""
    found = [
        (int(m.group(1)), p)
        for p in out.glob("checkpoint-*")
        if (m := _CHECKPOINT.match(p.name)) and p.is_dir()
    ]
    return [p for _, p in sorted(found)]


def read_rollout_state(checkpoint: Path | None) -> dict[str, Any]:
    """What the rollout side saved with a checkpoint ({} for a fresh start). A checkpoint to
    resume from has passed trainers.job.resume's checks, so its rollout state is there: a
    missing one is an error, never a silent restart of the data."""
    if checkpoint is None:
        return {}
    return json.loads((checkpoint / ROLLOUT_STATE).read_text())


def write_atomically(path: Path, text: str) -> None:
    """`path` holds either its old content or all of `text`, never part of it, even after a
    crash or a power loss: written beside it, flushed to disk, then renamed over it."""
    temp = path.with_name(f".{path.name}.tmp")
    with open(temp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)
    _fsync(path.parent)  # the rename itself is durable only once the folder is flushed


def mark_complete(folder: Path, step: int) -> int:
    """Write the marker that makes `folder` a checkpoint: every other file with its size, each
    flushed to disk first (so that after a power loss a marker never vouches for data still in
    the page cache). Returns the checkpoint's size in bytes."""
    files = {
        p.relative_to(folder).as_posix(): p.stat().st_size
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MARKER and not _is_temp(p.name)
    }
    for name in files:
        _fsync(folder / name)
    write_atomically(folder / MARKER, json.dumps({"step": step, "files": files}, indent=1))
    return sum(files.values())


def _is_temp(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def wandb_run_id(out: Path, resuming: bool = True) -> str:
    """This run's W&B id, kept in the output directory, so a resumed run logs into the same W&B
    run; a fresh start (`resuming` False) makes a new one, so that it never logs into the W&B
    run of an earlier job in the same directory."""
    path = out / WANDB_RUN_ID
    if resuming and path.is_file():
        return path.read_text().strip()
    import uuid

    run_id = uuid.uuid4().hex[:12]
    path.write_text(run_id)
    return run_id


def rollout_state_callback(rollout_state: Any, writer: bool = True):
    """A TrainerCallback that writes `rollout_state()` into each checkpoint as it is saved, then
    the marker that makes it complete (see the module's docstring), and times each save (from
    the step's end to the saved folder, the step's log included) and measures its size: `saves`
    holds (step, seconds, GiB). With the trainer across ranks every rank runs it and waits for
    the others' files; only the `writer` (rank 0) writes."""
    import time

    from transformers import TrainerCallback

    class RolloutStateCallback(TrainerCallback):
        def __init__(self) -> None:
            self.saves: list[tuple[int, float, float]] = []
            self._step_end = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self._step_end = time.perf_counter()
            if control.should_save and writer:
                # A folder an earlier run left at this step is about to be written over: its old
                # marker must not vouch for the mix of old and new files while that happens.
                folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                (folder / MARKER).unlink(missing_ok=True)

        def on_save(self, args, state, control, **kwargs):
            _wait_for_every_rank()  # their shards and RNG states, before the marker lists files
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if not writer or not folder.is_dir():
                return
            write_atomically(folder / ROLLOUT_STATE, json.dumps(rollout_state(), indent=1))
            size = mark_complete(folder, state.global_step)  # last: the checkpoint is whole
            seconds = time.perf_counter() - self._step_end
            self.saves.append((state.global_step, round(seconds, 2), round(size / 2**30, 3)))

    return RolloutStateCallback()


def _wait_for_every_rank() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
