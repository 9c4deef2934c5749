"""The GRPO job (`run_job`, in run.py; `plan_job` is `--plan`) and the pieces it runs, in order:

- config.py       JobConfig: every key, documented (its sections: config_trainer.py for
                  `trainer.*`, config_sections.py for the others); config_checks.py checks
                  each value, config_loading.py reads the YAML file and the dotted overrides
- preflight.py    the user's inputs, checked before Ray starts (lora_targets.py: LoRA's target
                  layers against the model, built on the meta device)
- resume.py       the checkpoint to resume from, checked whole before Ray starts
- layouts.py      every trainer rank and rollout actor seated on a node and GPU of the cluster
                  (or this machine), the seats' types in placement.py; seats_on_ray.py: the
                  nodes from Ray, the placement group
- training.py     one trainer process's part: rank 0's rollout pool, the TRL trainer, training,
                  the final model and the summary
- trainer_ranks.py  the trainer as Ray actors, one per rank, in one torch process group; the
                  first rank that fails ends the run
- checkpoints.py  the rollout side's part of each checkpoint, and the marker that completes it
                  (written after every rank's files)
- stopping.py     Ctrl-C and SIGTERM end the run at a step boundary, agreed by every rank
- console.py      one line per step, a line per dead actor, and the training plot
- session_reaper.py  the local Ray session's processes ended even if the job is killed
- summary.py      summary.json
"""

from trainers.job.run import run_job

__all__ = ["run_job"]
