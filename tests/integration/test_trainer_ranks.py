"""The trainer across ranks on CPU (real processes, gloo, FSDP2): the job with two ranks and an
actor, a sharded step against one process on the same batch, and a rank killed mid-run."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[2]
_ENGINE = "rollout.engine={max_model_len: 64, max_num_seqs: 16, num_kv_blocks: 64, block_size: 8}"


def _job_overrides(out: Path, policy_dir: str, prompts_file: str, *more: str) -> list[str]:
    return [
        f"output_dir={out}",
        f"model={policy_dir}",
        f"dataset.source={prompts_file}",
        "trainer.num_generations=2",
        "trainer.prompts_per_step=2",
        "trainer.max_completion_length=8",
        "wandb.mode=disabled",
        _ENGINE,
        *more,
    ]


@pytest.mark.slow
def test_two_sharded_ranks_and_an_actor_train_checkpoint_and_resume(
    tmp_path, policy_dir, prompts_file
) -> None:
    from transformers import AutoModelForCausalLM

    from trainers.job import run_job
    from trainers.job.config_loading import load_config

    out = tmp_path / "run"
    first = run_job(
        load_config(
            None,
            _job_overrides(
                out,
                policy_dir,
                prompts_file,
                "trainer.num_processes=2",
                "trainer.max_steps=2",
                "trainer.save_steps=2",
            ),
        )  # fmt: skip
    )
    assert first["steps"] == 2 and first["trainer_processes"] == 2
    assert first["weight_syncs"] >= 2, "the cold sync and the step's"
    parity = [d for d in first["logprob_max_abs_diff"] if d is not None]
    assert parity and max(parity) < 1e-4, "the actor holds the gathered shards' weights"
    assert first["weight_sync_bytes"] > 0
    checkpoint = out / "checkpoint-2"
    assert any(p.name.startswith("pytorch_model_fsdp") for p in checkpoint.iterdir()), (
        "each rank wrote its shard of the model"
    )
    assert (checkpoint / "checkpoint_complete.json").is_file()
    final = AutoModelForCausalLM.from_pretrained(out / "final_model")
    assert sum(p.numel() for p in final.parameters()) > 0, "the gathered final model loads"

    resumed = run_job(
        load_config(
            None,
            _job_overrides(
                out,
                policy_dir,
                prompts_file,
                "trainer.num_processes=2",
                "trainer.max_steps=3",
                "trainer.save_steps=0",
                "trainer.resume_from_checkpoint=latest",
            ),
        )  # fmt: skip
    )
    assert resumed["steps"] == 3 and resumed["resumed_from"].endswith("checkpoint-2")


# ---- one sharded step against one process, on the same batch ---------------------------------


class _FixedSamples:
    """A rollout worker (TRL's protocol) that serves the same samples to every run."""

    def __init__(self, samples) -> None:
        self.rollout_buffer: queue.Queue = queue.Queue()
        self.metrics_queue: queue.Queue = queue.Queue()
        for s in samples:
            self.rollout_buffer.put(s)

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def update_model_version(self, version: int) -> None:
        pass

    def check_health(self, stale_after_s: float) -> None:
        pass


class _GatheringTransfer:
    """Takes every (gathered) tensor rank 0 is handed, as a pool would, without a pool."""

    history: list = []

    def init_weight_transfer(self) -> None:
        pass

    def pause(self) -> None:
        pass

    def send_weights(self, iterator, specs=None, device=None) -> None:
        for _ in iterator:
            pass

    def resume(self) -> None:
        pass

    def destroy(self) -> None:
        pass


def _fixed_samples(vocab: int, groups: int = 12, per_group: int = 1):
    import random

    from trainers.trl_adapter.rollout_worker import rollout_sample

    rng = random.Random(0)
    samples = []
    for g in range(groups):
        prompt = [rng.randrange(3, vocab) for _ in range(6)]
        for _ in range(per_group):
            completion = [rng.randrange(3, vocab) for _ in range(5)]
            advantage = 1.0 if g % 2 else -1.0
            samples.append(
                rollout_sample(
                    "p", "c", prompt, completion, [-2.0] * len(completion), advantage, 0, g, {}
                )
            )
    return samples


def one_step(rank: int, world: int, port: int, policy_dir: str, out: str) -> None:
    """One optimizer step of the streaming trainer on `_fixed_samples`, in `world` ranks; rank 0
    writes the step's loss and the updated weights' checksum. A sample is 11 tokens and a row
    holds 22: the step's four samples are two rows, two forwards of one process or one forward
    on each of two ranks (the samples after them let the loader close and look ahead)."""
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WANDB_MODE="disabled",
    )  # fmt: skip
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer

    from trainers.trl_adapter.args import trl_config  # noqa: F401 - the adapter's import order
    from trainers.trl_adapter.sharded import fsdp_args
    from trainers.trl_adapter.streaming import build_async_trainer

    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    before = _checksum(__import__("transformers").AutoModelForCausalLM.from_pretrained(policy_dir))
    args = dict(
        output_dir=out, max_steps=1, learning_rate=1e-1, optim="sgd", per_device_train_batch_size=1,
        gradient_accumulation_steps=2 // world, num_generations=2, max_completion_length=8,
        temperature=1.0, logging_steps=1, report_to=[], save_strategy="no", use_cpu=True,
        max_staleness=4, weight_sync_steps=1, token_budget=22, dtype="float32", seed=0,
    )  # fmt: skip
    if world > 1:
        args |= fsdp_args()
    vocab = tokenizer.vocab_size
    trainer = build_async_trainer(
        policy_dir, tokenizer, Dataset.from_dict({"prompt": ["p"] * 4}), [],
        _FixedSamples(_fixed_samples(vocab)), _GatheringTransfer(), args,
    )  # fmt: skip
    trainer.train()
    loss = next(e["loss"] for e in trainer.state.log_history if "loss" in e)
    total = _checksum(trainer.accelerator.unwrap_model(trainer.model))
    if rank == 0:
        result = {"loss": loss, "weights": total, "before": before}
        result["groups"] = sorted(trainer._trained_groups)
        Path(out, "result.json").write_text(json.dumps(result))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _checksum(model) -> float:
    """Sum of |w| over the whole model (each shard gathered: a collective on every rank)."""
    total = 0.0
    for _, p in sorted(model.named_parameters()):
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        total += float(full.detach().double().abs().sum())
    return total


def _run_ranks(world: int, policy_dir: str, out: Path) -> dict:
    from rollout.weight_sync.group import free_port

    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    code = (
        "import sys; sys.path[:0] = [{root!r}, {tests!r}];"
        "from tests.integration.test_trainer_ranks import one_step;"
        "one_step({rank}, {world}, {port}, {policy!r}, {out!r})"
    )
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                code.format(
                    root=str(ROOT),
                    tests=str(ROOT / "tests"),
                    rank=r,
                    world=world,
                    port=port,
                    policy=policy_dir,
                    out=str(out),
                ),
            ],  # fmt: skip
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    try:
        logs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), "\n".join(log[-3000:] for log in logs)
    return json.loads((out / "result.json").read_text())


@pytest.mark.slow
def test_a_sharded_step_equals_one_process_on_the_same_batch(tmp_path, policy_dir) -> None:
    single = _run_ranks(1, policy_dir, tmp_path / "one")
    sharded = _run_ranks(2, policy_dir, tmp_path / "two")
    # TRL marks a sample trained when it is packed, so the loader's look-ahead rows count too.
    assert set(range(4)) <= set(sharded["groups"]) and set(range(4)) <= set(single["groups"])
    assert sharded["loss"] == pytest.approx(single["loss"], rel=1e-3)
    assert sharded["weights"] == pytest.approx(single["weights"], rel=1e-6), (
        "the same SGD update: the ranks' gradients add up to the one process's"
    )
    assert sharded["weights"] != pytest.approx(single["before"], rel=1e-7), "the step moved them"


# ---- a rank that dies ends the run ------------------------------------------------------------


@pytest.mark.slow
def test_a_killed_rank_ends_the_job_with_its_error_and_leaves_nothing(
    tmp_path, policy_dir, prompts_file
) -> None:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    args = _job_overrides(
        tmp_path / "run", policy_dir, prompts_file,
        "trainer.num_processes=2", "trainer.max_steps=500", "trainer.save_steps=0",
    )  # fmt: skip
    job = subprocess.Popen(
        [sys.executable, "scripts/train_grpo.py", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    watchdog = threading.Timer(600, job.kill)  # the first step never came: fail, never hang
    watchdog.start()
    try:
        for line in job.stdout:
            lines.append(line)
            if "[step 1/" in line:
                break
        watchdog.cancel()
        ours = _descendants(job.pid)  # this job's Ray: its raylet's workers, its helpers
        ranks = [pid for pid, args in ours.items() if args.startswith("ray::TrainerRank")]
        assert len(ranks) == 2, (ours, "".join(lines[-40:]))
        assert any(args.startswith("ray::RolloutWorker") for args in ours.values())
        os.kill(ranks[-1], 9)
        killed_at = time.monotonic()
        rest, _ = job.communicate(timeout=180)
        took = time.monotonic() - killed_at
    finally:
        job.kill()
    text = "".join(lines) + rest
    assert job.returncode == 1, text[-3000:]
    assert "error: trainer rank" in text and "died" in text, text[-3000:]
    assert took < 120, f"the job took {took:.0f} s to end after the rank died"
    for _ in range(30):  # every process of the job's Ray ends with it
        left = {pid: args for pid, args in _table().items() if pid in ours}
        if not left:
            break
        time.sleep(1)
    assert not left, left


@pytest.mark.slow
def test_a_rank_failing_at_start_is_one_line_and_leaves_nothing(
    tmp_path, policy_dir, prompts_file
) -> None:
    """A reward file that loads in the job's process (its checks pass) but raises where a rank
    loads it: the job ends with one line naming the rank, and its Ray is gone."""
    rewards = tmp_path / "rank_rewards.py"
    rewards.write_text(
        "import os\n"
        "if os.environ.get('RANK') == '1':\n"
        "    raise RuntimeError('no reward data on this node')\n"
        "def constant(prompts, completions, **kw):\n"
        "    return [0.0] * len(completions)\n"
    )
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    args = _job_overrides(
        tmp_path / "run", policy_dir, prompts_file,
        "trainer.num_processes=2", "trainer.max_steps=2", f"rewards=[{rewards}:constant]",
    )  # fmt: skip
    job = subprocess.Popen(
        [sys.executable, "scripts/train_grpo.py", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen: dict[int, str] = {}
    watchdog = threading.Timer(600, job.kill)
    watchdog.start()
    try:
        while job.poll() is None:  # what the job's Ray started, while it runs
            seen |= _descendants(job.pid)
            time.sleep(0.5)
        text = job.stdout.read()
    finally:
        watchdog.cancel()
        job.kill()
    last = text.strip().splitlines()[-1]
    assert job.returncode == 1, text[-3000:]
    assert last.startswith("train_grpo.py: error: trainer rank 1 (node this machine) failed"), last
    assert "no reward data on this node" in last and "every rank and actor was stopped" in last
    # The last line shows rank 1 ran and failed (its process may live too briefly to be seen).
    assert any("ray" in args for args in seen.values()), "the job's Ray was seen running"
    for _ in range(30):
        left = {pid: args for pid, args in _table().items() if pid in seen}
        if not left:
            break
        time.sleep(1)
    assert not left, left


def _table() -> dict[int, tuple[int, str]]:
    done = subprocess.run(
        ["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True, check=True
    )
    table = {}
    for line in done.stdout.splitlines():
        pid, ppid, *args = line.split(None, 2)
        table[int(pid)] = (int(ppid), args[0] if args else "")
    return table


def _descendants(root: int) -> dict[int, str]:
    table = _table()
    found: dict[int, str] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, args) in table.items():
            if ppid == parent and pid not in found:
                found[pid] = args
                frontier.append(pid)
    return found


# ---- LoRA: the adapter alone goes to the actors ------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("mode, ranks", [("streaming", 1), ("streaming", 2), ("sync", 2)])
def test_lora_syncs_only_the_adapter_and_writes_the_merged_model(
    tmp_path, policy_dir, prompts_file, mode, ranks
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from trainers.job import run_job
    from trainers.job.config_loading import load_config

    # rewards that differ within every group of two, whatever was sampled: a nonzero advantage,
    # so the adapter's B (zero at start) moves and the merged model differs from the base
    rewards = tmp_path / "alternate.py"
    rewards.write_text(
        "def alternate(prompts, completions, **kw):\n"
        "    return [float(i % 2) for i in range(len(completions))]\n"
    )
    out = tmp_path / "run"
    summary = run_job(
        load_config(
            None,
            _job_overrides(
                out,
                policy_dir,
                prompts_file,
                f"rewards=[{rewards}:alternate]",
                "trainer.lora.r=4",
                "trainer.learning_rate=1e-2",
                f"trainer.num_processes={ranks}",
                f"trainer.mode={mode}",
                # sync mode sends no cold sync: its two adapter versions come before steps 2, 3
                f"trainer.max_steps={2 if mode == 'streaming' else 3}",
                "trainer.save_steps=2",
            ),
        )  # fmt: skip
    )
    assert summary["lora"]["r"] == 4 and summary["mode"] == mode and summary["lora"]["alpha"] == 8.0
    base = AutoModelForCausalLM.from_pretrained(policy_dir)
    full_bytes = sum(p.numel() * 4 for p in base.parameters())
    assert 0 < summary["weight_sync_bytes"] < full_bytes / 5, "only the adapter moved"
    parity = [d for d in summary["logprob_max_abs_diff"] if d is not None]
    assert len(parity) >= 2 and max(parity) < 1e-4, "the actors merged exactly what trains"
    assert (out / "checkpoint-2" / "adapter_model.safetensors").is_file() or any(
        p.name.startswith("pytorch_model_fsdp") for p in (out / "checkpoint-2").iterdir()
    )
    assert (out / "final_model" / "adapter" / "adapter_config.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(out / "final_model")
    moved = [
        name
        for (name, p), q in zip(merged.named_parameters(), base.parameters(), strict=True)
        if not torch.equal(p, q)
    ]
    assert moved and all("proj" in name for name in moved), "the adapter's layers, merged in"


# ---- sync mode (trl.GRPOTrainer) across ranks --------------------------------------------------


@pytest.mark.slow
def test_sync_mode_two_ranks_train_like_one_on_the_same_rollouts(
    tmp_path, policy_dir, prompts_file
) -> None:
    """trl.GRPOTrainer under FSDP2 on two ranks: rank 0 generates every rank's groups (a group
    of 4 straddles the ranks' halves of the step), every rank syncs, and the first step (the same
    prompts, the same seeded rollouts) trains like one process: the same reward and loss."""
    from trainers.job import run_job
    from trainers.job.config_loading import load_config

    rewards = tmp_path / "spread.py"  # rewards that differ within a group: a nonzero loss
    rewards.write_text(
        "def spread(prompts, completions, **kw):\n"
        "    return [float(sum(map(ord, str(c))) % 7) for c in completions]\n"
    )

    def job(ranks: int, *more: str) -> dict:
        return run_job(
            load_config(
                None,
                _job_overrides(
                    tmp_path / f"ranks{ranks}",
                    policy_dir,
                    prompts_file,
                    "trainer.mode=sync",
                    "trainer.num_generations=4",
                    "trainer.prompts_per_step=1",
                    "trainer.gradient_accumulation_steps=1",
                    "trainer.learning_rate=1e-2",
                    f"rewards=[{rewards}:spread]",
                    f"trainer.num_processes={ranks}",
                    *more,
                ),
            )  # fmt: skip
        )

    one = job(1, "trainer.max_steps=1", "trainer.save_steps=1")
    two = job(2, "trainer.max_steps=2", "trainer.save_steps=1")
    assert two["steps"] == 2 and two["trainer_processes"] == 2
    parity = [d for d in two["logprob_max_abs_diff"] if d is not None]
    assert parity and max(parity) < 1e-4, "the actor holds the gathered shards' weights"
    assert two["reward_mean_first"] == one["reward_mean_first"], "the same rollouts"

    def first_step(ranks: int) -> dict:
        state = json.loads((tmp_path / f"ranks{ranks}/checkpoint-1/trainer_state.json").read_text())
        logged = next(e for e in state["log_history"] if "loss" in e)
        return {k: logged[k] for k in ("loss", "grad_norm", "reward")}

    assert first_step(1)["grad_norm"] > 0, "the step's samples have different advantages"
    assert first_step(2) == pytest.approx(first_step(1), rel=1e-4, abs=1e-6)
    checkpoint = tmp_path / "ranks2" / "checkpoint-2"
    assert any(p.name.startswith("pytorch_model_fsdp") for p in checkpoint.iterdir())


# ---- colocated ranks: each rank syncs the actor beside it -------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("mode, lora", [("streaming", False), ("sync", True)])
def test_colocated_ranks_each_sync_the_actor_beside_them(
    tmp_path, policy_dir, prompts_file, mode, lora
) -> None:
    """rollout.layout=colocated with two ranks (on CPUs: an actor beside each rank, gloo): each
    rank sends what it gathered to its own actor, and every actor then generates with the
    trainer's weights (the parity probe asks each actor)."""
    from transformers import AutoModelForCausalLM

    from trainers.job import run_job
    from trainers.job.config_loading import load_config

    summary = run_job(
        load_config(
            None,
            _job_overrides(
                tmp_path / "run",
                policy_dir,
                prompts_file,
                "rollout.layout=colocated",
                "trainer.num_processes=2",
                f"trainer.mode={mode}",
                "trainer.max_steps=3",
                "trainer.save_steps=0",
                "trainer.learning_rate=1e-2",
                *(["trainer.lora.r=4"] if lora else []),
            ),
        )  # fmt: skip
    )
    assert summary["layout"] == "colocated" and summary["num_actors"] == 2
    seats = {(s["role"], s["index"]): s["node_id"] for s in summary["placement"]}
    assert seats[("trainer", 1)] == seats[("actor", 1)]
    parity = [d for d in summary["logprob_max_abs_diff"] if d is not None]
    assert len(parity) >= 2 and max(parity) < 1e-4, "both actors hold what the ranks train"
    model_bytes = sum(
        p.numel() * 4 for p in AutoModelForCausalLM.from_pretrained(policy_dir).parameters()
    )
    if lora:
        assert 0 < summary["weight_sync_bytes"] < model_bytes / 5, "two adapters moved"
    else:
        assert summary["weight_sync_bytes"] == 2 * model_bytes, "each rank sent one copy"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["streaming", "sync"])
def test_routing_replay_across_two_sharded_ranks(tmp_path, near_tie_moe_dir, prompts_file, mode):
    """Each FSDP2 rank's forward takes its own rows' routes (streaming: rank 0 packs them for
    every row, the dispatcher slices them; sync: each rank keeps its slice of the rollout's).
    A near-tie MoE whose weights do not move: any gap left would be routing."""
    from trainers.job import run_job
    from trainers.job.config_loading import load_config

    summary = run_job(
        load_config(
            None,
            _job_overrides(
                tmp_path / "run",
                near_tie_moe_dir,
                prompts_file,
                "trainer.routing_replay=true",
                "trainer.learning_rate=1e-12",  # below the rounding of every weight
                "trainer.temperature=1.0",
                "trainer.num_processes=2",
                f"trainer.mode={mode}",
                "trainer.max_steps=2",
            ),
        )  # fmt: skip
    )
    assert summary["steps"] == 2 and summary["routing_flipped_fraction"] > 0
    assert abs(summary["off_policy"]["kl"]) < 1e-6, summary["off_policy"]
    parity = [d for d in summary["logprob_max_abs_diff"] if d is not None]
    assert parity and max(parity) < 1e-4
