"""The generation engine: scheduler, block manager, runner, sampler and the two step loops."""
