"""The GRPO job (`run_job`) and the pieces it runs, in order."""

from trainers.job.run import run_job

__all__ = ["run_job"]
