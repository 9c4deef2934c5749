"""Multi-turn rollouts: environments (tools, games, graders) in the loop of a sample.

base.py         the Environment interface (reset, step), StepResult, EpisodeLimits, loading
episodes.py     EpisodeRunner: a group's episodes over one engine, environments off its thread
calculator.py   the built-in example: arithmetic word problems with a calculator tool
"""

from rollout.environments.base import Environment, EpisodeLimits, StepResult, load_environment

__all__ = ["Environment", "EpisodeLimits", "StepResult", "load_environment"]
