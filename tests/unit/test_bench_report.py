"""The commit a benchmark's figures are filed under (benchmarks/lib/report.py)."""

from __future__ import annotations

import subprocess

from benchmarks.lib.report import commit_id


def _git(repo, *args: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_a_tree_that_differs_from_its_commit_is_marked_and_rollout_commit_wins(
    tmp_path, monkeypatch
) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("one\n")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    sha = _git(tmp_path, "rev-parse", "--short", "HEAD")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ROLLOUT_COMMIT", raising=False)
    assert commit_id() == sha
    (tmp_path / "b.txt").write_text("untracked files do not count\n")
    assert commit_id() == sha
    (tmp_path / "a.txt").write_text("two\n")
    assert commit_id() == f"{sha}+dirty"
    monkeypatch.setenv("ROLLOUT_COMMIT", "abc1234")
    assert commit_id() == "abc1234"
