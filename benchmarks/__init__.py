"""Benchmarks of the engine, the pool and the trainer, with their library and recorded results."""
