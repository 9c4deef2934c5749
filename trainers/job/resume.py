"""Which checkpoint a run resumes from, and whether it is whole: decided before Ray starts.

A checkpoint is complete iff its marker (`checkpoint_complete.json`, written last by
trainers.job.checkpoints) lists files that are all there at their recorded sizes. Beyond the
sizes, each file that says how long it should be is read that far: JSON files parse, a
safetensors file is exactly as long as its header says, a torch file's zip directory opens. No
tensor is loaded, so an 8B model's checkpoint is checked in about a second.

`trainer.resume_from_checkpoint`:
  latest        the newest checkpoint folder under output_dir; if it is incomplete or damaged,
                the run stops, naming it and the previous complete one
  latest_valid  the newest complete and whole one, with one line for each newer folder skipped
  a folder      that checkpoint, checked the same way; one without a marker (saved by a version
                from before it) is taken when its rollout state is there and every file reads
  None          a fresh start
"""

from __future__ import annotations

import json
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

from trainers.job.checkpoints import MARKER, ROLLOUT_STATE, checkpoints
from trainers.job.preflight import JobInputError

TRAINER_STATE = "trainer_state.json"
KEY = "trainer.resume_from_checkpoint"
# Up to this size a torch file has every member's CRC checked; above it only its zip directory,
# which sits at the file's end (so a truncated file fails it) and reads in milliseconds.
FULL_ZIP_TEST_BYTES = 64 * 2**20
_SAFETENSORS_HEADER_LIMIT = 100 * 2**20  # safetensors' own limit on a header
_TORCH_FILES = (".pt", ".pth", ".bin")


class BrokenCheckpoint(Exception):
    """A folder that cannot be resumed from; the message names the file and what is wrong."""


def resolve_resume(setting: str | None, out: Path, say: Callable[[str], None] = print):
    """The checkpoint `trainer.resume_from_checkpoint` names (see the module's docstring), checked;
    None for a fresh start. Anything else is a one-line `JobInputError` that names the folder, the
    file and what to set instead. `say` gets the lines about folders skipped or taken as legacy."""
    if setting is None:
        return None
    setting = str(setting)
    if setting in ("latest", "latest_valid"):
        return _newest(setting, out, say)
    return _named(setting, say)


def _newest(setting: str, out: Path, say: Callable[[str], None]) -> Path:
    folders = checkpoints(out)
    if not folders:
        raise JobInputError(
            f"{KEY}={setting}: no checkpoint under {out}; start without it, or set output_dir to "
            "the run to resume"
        )
    broken: list[tuple[Path, str]] = []
    for folder in reversed(folders):
        try:
            check_checkpoint(folder)
        except BrokenCheckpoint as err:
            broken.append((folder, str(err)))
            continue
        if broken and setting == "latest":
            newest, why = broken[0]
            raise JobInputError(
                f"{KEY}=latest: the newest checkpoint {newest} is not resumable: {why}. The "
                f"previous complete one is {folder}: set {KEY}=latest_valid to resume from it, "
                f"or delete {newest}"
            )
        for skipped, why in broken:
            say(f"[train_grpo] {KEY}=latest_valid: skipping {skipped}: {why}")
        return folder
    newest, why = broken[0]
    raise JobInputError(
        f"{KEY}={setting}: no complete checkpoint under {out}; the newest, {newest}, is not "
        f"resumable: {why}. Start without {KEY}, or give a checkpoint folder"
    )


def _named(setting: str, say: Callable[[str], None]) -> Path:
    path = Path(setting).expanduser()
    if not ((path / TRAINER_STATE).is_file() or (path / MARKER).is_file()):
        raise JobInputError(
            f"{KEY}={setting}: not a checkpoint folder (no {TRAINER_STATE}); give a "
            "checkpoint-<step> folder, latest or latest_valid"
        )
    try:
        marked = check_checkpoint(path, unmarked_ok=True)
    except BrokenCheckpoint as err:
        raise JobInputError(f"{KEY}={setting}: not resumable: {err}") from None
    if not marked:
        say(
            f"[train_grpo] {path} has no {MARKER} (saved by an older version, or stopped just "
            "before it): its rollout state is there and every file reads, so resuming from it"
        )
    return path


def check_checkpoint(folder: Path, unmarked_ok: bool = False) -> bool:
    """Raise `BrokenCheckpoint` naming the file unless `folder` is a complete checkpoint whose
    files read. With `unmarked_ok`, a folder without a marker is checked file by file instead:
    the rollout state is written after everything transformers saves, so with it there and
    every file whole the save had finished. Returns whether the folder had a marker."""
    if not folder.is_dir():
        raise BrokenCheckpoint(f"{folder} is not a folder")
    marked = (folder / MARKER).is_file()
    if marked:
        files = _listed(folder)
    elif unmarked_ok:
        files = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    else:
        raise BrokenCheckpoint(
            f"no {MARKER}, so its save did not finish (a checkpoint saved before checkpoints had "
            f"this marker is resumed only by giving its folder as {KEY})"
        )
    for needed in (TRAINER_STATE, ROLLOUT_STATE):
        if needed not in files:
            raise BrokenCheckpoint(f"{needed} is missing")
    for name in sorted(files):
        try:
            _check_file(folder / name)
        except OSError as err:
            raise BrokenCheckpoint(f"{name} cannot be read ({err.strerror or err})") from None
    return marked


def _listed(folder: Path) -> set[str]:
    """The marker's files, each checked to be there at its recorded size."""
    try:
        files = json.loads((folder / MARKER).read_text())["files"]
        sizes = {str(name): int(size) for name, size in files.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise BrokenCheckpoint(f"{MARKER} does not list the checkpoint's files ({err})") from None
    for name, size in sizes.items():
        path = folder / name
        if not path.is_file():
            raise BrokenCheckpoint(f"{name} is missing (listed in {MARKER})")
        actual = path.stat().st_size
        if actual != size:
            cut = " (truncated)" if actual < size else ""
            raise BrokenCheckpoint(f"{name} is {actual} bytes, {MARKER} says {size}{cut}")
    return set(sizes)


def _check_file(path: Path) -> None:
    if path.suffix == ".json":
        try:
            json.loads(path.read_bytes())
        except ValueError as err:  # JSONDecodeError and UnicodeDecodeError both
            raise BrokenCheckpoint(f"{path.name} is not valid JSON ({err})") from None
    elif path.suffix == ".safetensors":
        _check_safetensors(path)
    elif path.suffix in _TORCH_FILES:
        _check_torch_file(path)


def _check_safetensors(path: Path) -> None:
    """The 8-byte header length, the JSON header, and the file exactly as long as the header's
    last tensor ends (the length safetensors itself insists on when loading)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise BrokenCheckpoint(
                f"{path.name} is {size} bytes, shorter than a safetensors header"
            )
        (length,) = struct.unpack("<Q", head)
        if length > min(size - 8, _SAFETENSORS_HEADER_LIMIT):
            raise BrokenCheckpoint(
                f"{path.name} is {size} bytes, its safetensors header alone says {8 + length} "
                "(truncated)"
            )
        try:
            header = json.loads(f.read(length))
            end = max(
                (int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"),
                default=0,
            )
        except (ValueError, KeyError, TypeError, AttributeError, IndexError):
            raise BrokenCheckpoint(f"{path.name} has no readable safetensors header") from None
    expected = 8 + length + end
    if size != expected:
        cut = " (truncated)" if size < expected else ""
        raise BrokenCheckpoint(f"{path.name} is {size} bytes, its header says {expected}{cut}")


def _check_torch_file(path: Path) -> None:
    """torch.save writes a zip archive: its directory opens (a truncated file has lost it), and
    a small file's members match their CRCs."""
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip() if path.stat().st_size <= FULL_ZIP_TEST_BYTES else None
    except (zipfile.BadZipFile, EOFError, ValueError) as err:
        raise BrokenCheckpoint(
            f"{path.name} is not a whole torch file (its zip archive does not open: {err}; "
            "truncated?)"
        ) from None
    if damaged is not None:
        raise BrokenCheckpoint(f"{path.name} is damaged: its member {damaged} fails its CRC")
