"""TRL integration: the GRPO trainer adapter, rewards, datasets, weight sending."""
