"""The generation engine: `LLMEngine` over a scheduler (host) and a model runner (device).

config.py, sampling_params.py   EngineConfig and SamplingParams (frozen, validated)
llm_engine.py                   LLMEngine: requests in, completions out; stats, weights
assembly.py                     its parts, built for a model and config and checked together
stats.py                        EngineStats: what the engine reports about itself
weight_update.py                new weights copied in place, after the steps in flight
forward_check.py                the construction-time forward that refuses what it cannot serve
seeds.py                        the seeds of requests that bring none
step_loop.py                    SyncLoop and OverlapLoop: the two ways to drive a step
stop_strings.py                 SamplingParams.stop, checked per token
scheduling/                     the host-only part (no torch)
model/                          transformers' model classes on the paged cache
execution/                      the device part: runner, slots, streams, graphs, sampler
"""
