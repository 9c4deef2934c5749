"""The README's Ray cluster job, from the README's own setup: a local head started with Ray's
CLI, the job submitted through the jobs API for one step, its summary read back, the head
stopped.

Each `ray start` runs in a session of its own, which every process it leaves behind keeps (Ray
gives its workers process groups of their own, not sessions), and the test ends exactly those
processes: `ray stop --force` would end every Ray on the machine, a developer's own jobs too."""

from __future__ import annotations

import json
import os
import re
import signal
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


def _start_ray(args: list[str], env: dict, sessions: list[int]) -> subprocess.CompletedProcess:
    """`ray start ...` in a new session, whose id (the CLI's pid) joins `sessions`."""
    process = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    sessions.append(process.pid)
    try:
        out, err = process.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        process.kill()  # the caller's _stop_sessions ends what it started
        raise
    return subprocess.CompletedProcess(args, process.returncode, out, err)


def _stop_sessions(sessions: list[int], grace_s: float = 30.0) -> None:
    """End every process in `sessions`: SIGTERM, then SIGKILL for what is left after grace_s."""
    import psutil  # with ray[default]

    def members():  # (an exited one is left to its parent: nothing to end)
        found = []
        for proc in psutil.process_iter():
            try:
                if os.getsid(proc.pid) in sessions and proc.status() != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except (ProcessLookupError, PermissionError, psutil.NoSuchProcess):
                continue
        return found

    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        for proc in members():
            try:
                proc.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        deadline = time.monotonic() + wait_s
        while members() and time.monotonic() < deadline:
            time.sleep(0.2)


@pytest.mark.slow
def test_ray_job_submit_runs_the_job(tmp_path) -> None:
    pytest.importorskip("ray.dashboard", reason="the jobs CLI needs ray[default]")
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    env.pop("RAY_ADDRESS", None)
    out = tmp_path / "job"
    sessions: list[int] = []
    try:
        done = _run([RAY, "get-auth-token", "--generate"], env, timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        done = _start_ray([RAY, "start", "--head", "--disable-usage-stats"], env, sessions)
        assert done.returncode == 0, done.stdout + done.stderr
        submit = [
            RAY, "job", "submit", "--address", "http://127.0.0.1:8265", "--working-dir", ".",
            "--", sys.executable, "scripts/train_grpo.py", "--config", "configs/default.yaml",
            "trainer.max_steps=1", f"output_dir={out}", "wandb.mode=disabled",
        ]  # fmt: skip
        deadline = time.monotonic() + 300  # a loaded machine can take minutes
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
        _stop_sessions(sessions)


@pytest.mark.slow
def test_two_ranks_and_two_actors_spread_over_a_two_node_cluster(
    tmp_path, policy_dir, prompts_file
) -> None:
    """`ray start` twice on this machine: a head with one CPU (no room for the trainer's two
    ranks) and a worker with three. `--plan` and the job both put the ranks on the worker and
    the actors on both nodes."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    address = "127.0.0.1:6391"
    job = [
        sys.executable, "scripts/train_grpo.py", f"ray_address={address}",
        f"output_dir={tmp_path / 'run'}", f"model={policy_dir}", f"dataset.source={prompts_file}",
        "trainer.num_processes=2", "rollout.num_actors=2", "trainer.max_steps=1",
        "trainer.num_generations=2", "trainer.prompts_per_step=2",
        "trainer.max_completion_length=8", "trainer.save_steps=0", "wandb.mode=disabled",
        "rollout.engine={max_model_len: 64, max_num_seqs: 16, num_kv_blocks: 64, block_size: 8}",
    ]  # fmt: skip
    sessions: list[int] = []
    try:
        for step in (
            [RAY, "start", "--head", "--port=6391", "--num-cpus=1", "--num-gpus=0",
             "--include-dashboard=false", "--disable-usage-stats"],
            [RAY, "start", f"--address={address}", "--num-cpus=3", "--num-gpus=0"],
        ):  # fmt: skip
            done = _start_ray(step, env, sessions)
            assert done.returncode == 0, done.stdout + done.stderr
        plan = _run([job[0], job[1], "--plan", *job[2:]], env, timeout=300)
        assert plan.returncode == 0, plan.stdout[-3000:] + plan.stderr[-3000:]
        seats = [line for line in plan.stdout.splitlines() if line.startswith("  ")]
        assert len(seats) == 4 and plan.stdout.startswith("layout cpu"), plan.stdout
        run = _run(job, env, timeout=900)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert summary["steps"] == 1 and summary["trainer_processes"] == 2
        ranks = {s["node_id"] for s in summary["placement"] if s["role"] == "trainer"}
        actors = {s["node_id"] for s in summary["placement"] if s["role"] == "actor"}
        assert len(ranks) == 1 and len(actors) == 2, summary["placement"]
        # A third node with four logical GPUs: the plan moves to them (nothing is started).
        gpus = [RAY, "start", f"--address={address}", "--num-cpus=1", "--num-gpus=4"]
        done = _start_ray(gpus, env, sessions)
        assert done.returncode == 0, done.stdout + done.stderr
        plan = _run([job[0], job[1], "--plan", *job[2:4], "trainer.num_processes=2"], env, 300)
        assert plan.returncode == 0, plan.stdout[-3000:] + plan.stderr[-3000:]
        lines = plan.stdout.splitlines()
        assert lines[0].startswith("layout split: 2 trainer rank(s), 2 rollout actor(s)"), lines
        seated = [re.search(r"node \S+ \((\w+)\)\s+GPU (\d)", line).groups() for line in lines[1:]]
        assert len({node for node, _ in seated}) == 1, "all four on the GPU node"
        assert [gpu for _, gpu in seated] == ["0", "1", "2", "3"], lines
    finally:
        _stop_sessions(sessions)
