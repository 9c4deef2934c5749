"""Checkpoints: the marker written last makes one complete, and a run resumes only from a complete
one whose files read. Folders are made of real files (a tiny model's safetensors, a torch.save'd
optimizer state, transformers' trainer state) and completed by the job's own callback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.conftest import tiny_model
from trainers.job import checkpoints
from trainers.job.checkpoints import MARKER, read_rollout_state, rollout_state_callback
from trainers.job.preflight import JobInputError
from trainers.job.resume import check_checkpoint, resolve_resume


class Crash(Exception):
    """Stands for the process dying at that point of a save."""


@pytest.fixture(scope="module")
def saved_by_transformers(tmp_path_factory) -> Path:
    """What transformers' Trainer has written into checkpoint-<step>/ when the callbacks run."""
    from transformers import TrainerState

    folder = tmp_path_factory.mktemp("transformers-part")
    model = tiny_model("llama")
    model.save_pretrained(folder, safe_serialization=True)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()  # an optimizer state with tensors in it, as a real one has
    torch.save(optimizer.state_dict(), folder / "optimizer.pt")
    TrainerState(global_step=1).save_to_json(str(folder / "trainer_state.json"))
    return folder


def save(out: Path, step: int, transformers_part: Path):
    """checkpoint-<step> under `out`, finished by the job's callback; returns (folder, callback)."""
    folder = out / f"checkpoint-{step}"
    shutil.copytree(transformers_part, folder)
    callback = rollout_state_callback(
        lambda: {"dataset_position": 2 * step, "model_version": step, "wandb_run_id": "run1"}
    )
    callback.on_save(SimpleNamespace(output_dir=str(out)), SimpleNamespace(global_step=step), None)
    return folder, callback


def crash_at(monkeypatch, name: str) -> None:
    """The next save dies while writing `name` (before it is in place)."""
    write = checkpoints.write_atomically

    def dying(path: Path, text: str) -> None:
        if path.name == name:
            raise Crash(name)
        write(path, text)

    monkeypatch.setattr(checkpoints, "write_atomically", dying)


def refusal(setting: str, out: Path) -> str:
    with pytest.raises(JobInputError) as err:
        resolve_resume(setting, out, say=pytest.fail)
    message = str(err.value)
    assert "\n" not in message, "one line"
    return message


def test_a_saved_checkpoint_is_complete_and_resumed_by_latest(tmp_path, saved_by_transformers):
    folder, callback = save(tmp_path, 4, saved_by_transformers)
    marker = json.loads((folder / MARKER).read_text())
    on_disk = {p.name: p.stat().st_size for p in folder.iterdir() if p.name != MARKER}
    assert marker == {"step": 4, "files": on_disk}
    assert {"model.safetensors", "optimizer.pt", "rollout_state.json"} <= set(on_disk)
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]
    assert check_checkpoint(folder) is True
    assert resolve_resume("latest", tmp_path, say=pytest.fail) == folder
    assert resolve_resume(str(folder), tmp_path, say=pytest.fail) == folder
    assert read_rollout_state(folder)["model_version"] == 4
    assert callback.saves[0][0] == 4 and callback.saves[0][2] > 0
    assert resolve_resume(None, tmp_path) is None


@pytest.mark.parametrize("dies_at", [MARKER, "rollout_state.json"])
def test_a_save_cut_short_is_not_taken_by_latest(
    tmp_path, saved_by_transformers, monkeypatch, dies_at
) -> None:
    """The run dies during step 6's save, after transformers wrote its part: `latest` refuses
    that folder, naming it and step 4's complete one; `latest_valid` takes step 4."""
    previous, _ = save(tmp_path, 4, saved_by_transformers)
    crash_at(monkeypatch, dies_at)
    with pytest.raises(Crash):
        save(tmp_path, 6, saved_by_transformers)
    monkeypatch.undo()
    cut = tmp_path / "checkpoint-6"
    assert (cut / "trainer_state.json").is_file() and not (cut / MARKER).exists()

    message = refusal("latest", tmp_path)
    assert f"newest checkpoint {cut} is not resumable: no {MARKER}" in message
    assert f"previous complete one is {previous}" in message
    assert "trainer.resume_from_checkpoint=latest_valid" in message

    said: list[str] = []
    assert resolve_resume("latest_valid", tmp_path, say=said.append) == previous
    assert len(said) == 1 and str(cut) in said[0] and MARKER in said[0]


def test_a_rollout_state_lost_after_the_save_is_named(tmp_path, saved_by_transformers) -> None:
    """The issue's case (the rollout state deleted): the run stops instead of restarting the data
    at position 0."""
    save(tmp_path, 4, saved_by_transformers)
    folder, _ = save(tmp_path, 6, saved_by_transformers)
    (folder / "rollout_state.json").unlink()
    message = refusal("latest", tmp_path)
    assert f"rollout_state.json is missing (listed in {MARKER})" in message
    assert str(tmp_path / "checkpoint-4") in message
    assert "rollout_state.json is missing" in refusal(str(folder), tmp_path)


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt"])
def test_a_truncated_file_is_refused_by_name(tmp_path, saved_by_transformers, name) -> None:
    save(tmp_path, 4, saved_by_transformers)
    folder, _ = save(tmp_path, 6, saved_by_transformers)
    data = (folder / name).read_bytes()
    (folder / name).write_bytes(data[: len(data) // 2])

    message = refusal("latest", tmp_path)
    assert f"{name} is {len(data) // 2} bytes, {MARKER} says {len(data)} (truncated)" in message
    assert str(tmp_path / "checkpoint-4") in message
    assert name in refusal(str(folder), tmp_path)

    # Without the marker's sizes (a folder saved before it existed), the file's own header
    # still finds the cut.
    (folder / MARKER).unlink()
    message = refusal(str(folder), tmp_path)
    assert f"not resumable: {name}" in message and "truncated" in message


def test_damage_that_keeps_the_size_is_found_by_reading_the_file(
    tmp_path, saved_by_transformers
) -> None:
    folder, _ = save(tmp_path, 4, saved_by_transformers)
    optimizer = bytearray((folder / "optimizer.pt").read_bytes())
    optimizer[len(optimizer) // 3] ^= 0xFF  # inside a tensor's bytes
    (folder / "optimizer.pt").write_bytes(bytes(optimizer))
    assert "optimizer.pt is damaged" in refusal("latest", tmp_path)

    folder, _ = save(tmp_path / "b", 4, saved_by_transformers)
    state = (folder / "trainer_state.json").read_bytes()
    (folder / "trainer_state.json").write_bytes(b"#" * len(state))
    assert "trainer_state.json is not valid JSON" in refusal("latest", tmp_path / "b")


def test_a_checkpoint_from_before_the_marker(tmp_path, saved_by_transformers) -> None:
    """Not taken by `latest`; taken when named, if its rollout state is there and every file
    reads, with a line saying so."""
    folder, _ = save(tmp_path, 4, saved_by_transformers)
    (folder / MARKER).unlink()
    message = refusal("latest", tmp_path)
    assert f"no complete checkpoint under {tmp_path}" in message and str(folder) in message
    said: list[str] = []
    assert resolve_resume(str(folder), tmp_path, say=said.append) == folder
    assert len(said) == 1 and MARKER in said[0]
    (folder / "rollout_state.json").unlink()
    assert "rollout_state.json is missing" in refusal(str(folder), tmp_path)


def test_nothing_to_resume_says_what_to_do(tmp_path) -> None:
    assert "no checkpoint under" in refusal("latest", tmp_path)
    assert "no checkpoint under" in refusal("latest_valid", tmp_path)
    assert "not a checkpoint folder" in refusal(str(tmp_path / "nowhere"), tmp_path)


def test_the_folders_are_listed_by_step(tmp_path) -> None:
    for step in (2, 10, 4):
        (tmp_path / f"checkpoint-{step}").mkdir()
    (tmp_path / "checkpoint-12").write_text("")  # not a folder
    (tmp_path / "checkpoint-x").mkdir()
    names = [p.name for p in checkpoints.checkpoints(tmp_path)]
    assert names == ["checkpoint-2", "checkpoint-4", "checkpoint-10"]


def test_a_file_written_atomically_is_old_or_new_never_half(tmp_path, monkeypatch) -> None:
    path = tmp_path / "rollout_state.json"
    checkpoints.write_atomically(path, '{"model_version": 1}')

    def dies(*args):
        raise Crash("rename")

    monkeypatch.setattr(checkpoints.os, "replace", dies)
    with pytest.raises(Crash):
        checkpoints.write_atomically(path, '{"model_version": 2}')
    assert json.loads(path.read_text()) == {"model_version": 1}


def test_the_job_stops_on_a_broken_checkpoint_before_ray_starts(
    tmp_path, saved_by_transformers, policy_dir, prompts_file, monkeypatch
) -> None:
    from trainers.job import run
    from trainers.job.config_loading import load_config

    save(tmp_path, 4, saved_by_transformers)
    folder, _ = save(tmp_path, 6, saved_by_transformers)
    (folder / "optimizer.pt").write_bytes((folder / "optimizer.pt").read_bytes()[:100])

    def no_ray(*args):
        raise AssertionError("Ray started before the checkpoint was checked")

    monkeypatch.setattr(run, "ray_session", no_ray)
    for key in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_SILENT"):
        monkeypatch.setenv(key, "")  # run_job sets them: put them back afterwards
    config = load_config(
        None,
        [
            f"output_dir={tmp_path}",
            f"model={policy_dir}",
            f"dataset.source={prompts_file}",
            "wandb.mode=disabled",
            "trainer.resume_from_checkpoint=latest",
        ],
    )
    with pytest.raises(JobInputError, match=r"checkpoint-6 is not resumable: optimizer\.pt is 100"):
        run.run_job(config)


def test_a_save_over_an_old_folder_drops_its_marker_first(tmp_path, saved_by_transformers):
    """A run resumed from step 4 saves step 6 into the folder an earlier run left there: until
    the new save is whole, the old marker must not make that folder look complete."""
    folder, callback = save(tmp_path, 6, saved_by_transformers)
    args, state = SimpleNamespace(output_dir=str(tmp_path)), SimpleNamespace(global_step=6)
    callback.on_step_end(args, state, SimpleNamespace(should_save=False))
    assert (folder / MARKER).is_file(), "no save at this step: the folder is left alone"
    callback.on_step_end(args, state, SimpleNamespace(should_save=True))
    assert not (folder / MARKER).exists()
