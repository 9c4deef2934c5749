"""The GRPO job (`run_job`, in run.py) and the pieces it runs, in order:

- config.py       JobConfig: every key, documented; config_checks.py checks each value,
                  config_loading.py reads the YAML file and the dotted overrides
- preflight.py    the user's inputs, checked before Ray starts (lora_targets.py: LoRA's target
                  layers against the model, built on the meta device)
- placement.py    where the trainer and the rollout actors run
- resume.py       the checkpoint to resume from, checked whole before Ray starts
- checkpoints.py  the rollout side's part of each checkpoint, and the marker that completes it
- stopping.py     Ctrl-C and SIGTERM end the run at a step boundary
- console.py      one line per step, a line per dead actor, and the training plot
- session_reaper.py  the local Ray session's processes ended even if the job is killed
- summary.py      summary.json

Leaves room for the trainer ranks (FSDP2 over Ray) that come next: their placement on the
cluster beside the actors' belongs in placement.py, and starting them in run.py.
"""

from trainers.job.run import run_job

__all__ = ["run_job"]
