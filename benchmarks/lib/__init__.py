"""Benchmark workloads, the bandwidth roofline, and transformers' own continuous batching."""
