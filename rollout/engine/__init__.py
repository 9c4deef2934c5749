"""The generation engine: `LLMEngine` over a scheduler (host) and a model runner (device).

config.py, sampling_params.py   EngineConfig and SamplingParams (frozen, validated)
llm_engine.py                   LLMEngine: requests in, completions out
step_loop.py                    SyncLoop and OverlapLoop: the two ways to drive a step
scheduling/                     the host-only part (no torch)
model/                          transformers' model classes on the paged cache
execution/                      the device part: runner, slots, streams, graphs, sampler
"""
