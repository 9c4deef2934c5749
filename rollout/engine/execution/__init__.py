"""The engine's device part: run one planned step and bring back its sampled tokens.

model_runner.py  ModelRunner: copy in, carry over, forward, sample, copy out; the one wait
step_slot.py     one of the two input/output slots (pinned host + device buffers)
streams.py       copy-in / compute / copy-out streams and events (no-ops on CPU)
cuda_graph.py    decode steps captured per (batch bucket, slot, sampler mode)
sampler.py       on-device sampling and logprobs with counter-based seeded noise
kv_cache.py      the paged KV cache tensors: shape from the model, size from memory
device_timing.py device time per step (benchmarks: the GPU-busy fraction)
"""
