"""Weight sync: the trainer's parameters into the rollout engines, in place, between steps."""
