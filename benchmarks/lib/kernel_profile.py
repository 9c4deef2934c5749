"""Where a decode step's device time goes: kernel time by name over a few engine steps."""

from __future__ import annotations


def profile_decode(engine, prompts, num_steps: int) -> list[dict]:
    """Kernel time by name over `num_steps` decode steps (graph replays included)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from rollout import SamplingParams

    params = SamplingParams(max_tokens=num_steps + 16, ignore_eos=True, seed=3)
    for i, prompt in enumerate(prompts):
        engine.add_request(prompt, params, request_id=f"p{i}", first_index=i)
    for _ in range(8):  # past the prefill
        engine.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(num_steps):
            engine.step()
        torch.cuda.synchronize()
    while engine.has_unfinished():
        engine.step()
    rows = []
    for event in prof.key_averages():
        device_us = getattr(event, "device_time_total", None) or getattr(
            event, "cuda_time_total", 0
        )
        if device_us:
            rows.append(
                {"name": event.key[:90], "calls": event.count, "us_per_step": device_us / num_steps}
            )
    rows.sort(key=lambda r: -r["us_per_step"])
    total = sum(r["us_per_step"] for r in rows)
    print(f"[bench]   profile: {total / 1e3:.2f} ms of kernels per step; top kernels:")
    for r in rows[:14]:
        print(
            f"[bench]     {r['us_per_step']:8.1f} us  x{r['calls'] / num_steps:5.1f}  {r['name']}"
        )
    return rows[:40]
