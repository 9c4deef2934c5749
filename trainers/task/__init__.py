"""What is learned: the prompts and how their completions are scored. Nothing here imports TRL or
the job (the rewards keep TRL's reward signature, so that either mode's trainer calls them).

- datasets.py        built-in generated math problems, local files, cached hub datasets
- rewards.py         the built-in reward functions and their registry
- reward_loading.py  a reward named in the config (registered, module or file) as a callable
- scoring.py         a completed group's rewards and group-normalised advantages
"""
