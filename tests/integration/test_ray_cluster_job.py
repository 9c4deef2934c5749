"""The README's Ray cluster job, from the README's own setup: a local head started with Ray's
CLI, the job submitted through the jobs API for one step, its summary read back, the head
stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")
_OWN_RAY = """
import ray
from trainers.job.config import JobConfig
from trainers.job.run import ray_session
config = JobConfig()
with ray_session(config):
    address = ray.get_runtime_context().gcs_address
    assert not address.endswith(":6379"), f"joined the head at {address}"
    print("own ray at", address)
"""


def _run(args: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.slow
def test_ray_job_submit_runs_the_job(tmp_path) -> None:
    pytest.importorskip("ray.dashboard", reason="the jobs CLI needs ray[default]")
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    env.pop("RAY_ADDRESS", None)
    out = tmp_path / "job"
    steps = [
        [RAY, "get-auth-token", "--generate"],
        [RAY, "start", "--head", "--disable-usage-stats"],
    ]
    try:
        for step in steps:
            done = _run(step, env, timeout=180)
            assert done.returncode == 0, done.stdout + done.stderr
        submit = [
            RAY, "job", "submit", "--address", "http://127.0.0.1:8265", "--working-dir", ".",
            "--", sys.executable, "scripts/train_grpo.py", "--config", "configs/default.yaml",
            "trainer.max_steps=1", f"output_dir={out}", "wandb.mode=disabled",
        ]  # fmt: skip
        deadline = time.monotonic() + 120
        while True:  # the head's job agent comes up a little after `ray start` returns
            job = _run(submit, env, timeout=900)
            if "No available agent" not in job.stderr or time.monotonic() > deadline:
                break
            time.sleep(5)
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
        assert "succeeded" in job.stdout
        summary = json.loads((out / "summary.json").read_text())
        assert summary["steps"] == 1 and summary["num_actors"] == 1
        assert Path(summary["final_model"]).is_dir()
        # A run without `ray_address` beside that head starts a Ray of its own, not a join that
        # Ray refuses for the resources the run asks for.
        own = _run([sys.executable, "-c", _OWN_RAY], env, timeout=300)
        assert own.returncode == 0 and "own ray" in own.stdout, own.stdout + own.stderr[-3000:]
    finally:
        _run([RAY, "stop", "--force"], env, timeout=120)
