"""Scale-out benchmark: rollout throughput through the RolloutPool at 1, 2, 4 ... Ray actors, and
the time to sync a model's weights from a trainer process to all of them.

    python benchmarks/bench_scale.py --workload w1 --actors 1,2 --json-out out/scale.json   # GPUs
    python benchmarks/bench_scale.py --smoke                                                # CPU
    python benchmarks/bench_scale.py --workload w1 --actors 1 --no-throughput \
        --sync-backend cuda_ipc,gloo                     # one GPU: trainer and actor share it

Each actor owns one GPU (CPU: one CPU actor each) and gets the workload's whole request mix, so
N actors generate N times the tokens of one (weak scaling); efficiency = tokens/s at N actors /
(N x tokens/s at 1 actor). Weights are random (load_format="dummy" from a config.json written
here), EOS is ignored, every sample streams back through the pool as it finishes.

Weight sync: the trainer side holds the same model in this process and sends it with
`RolloutPool.sync_weights`, `--sync-repeats` times per backend; the first sync also builds the
process group and is reported apart. With several GPUs the trainer keeps GPU 0, which no actor
uses (only actor counts below the GPU count are synced), and `--sync-backend auto` is NCCL; on a
machine with one GPU a single actor shares it with the trainer (its engine held to 45% of the
memory, as the job places them) and auto is CUDA IPC; on CPU, gloo.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollout.process_env import set_process_env_defaults  # noqa: E402

set_process_env_defaults()


def run_throughput(pool, workload, num_actors: int, prompts: list[list[int]]) -> dict:
    from rollout import SamplingParams

    params = SamplingParams(max_tokens=workload.new_tokens, temperature=1.0, ignore_eos=True)
    # Warm-up on every actor: kernels compiled, decode graphs captured, before the clock starts.
    warm = SamplingParams(max_tokens=8, ignore_eos=True)
    for _ in range(num_actors * 2):
        pool.submit(prompts[0], warm)
    for _ in range(num_actors * 2):
        pool.get(timeout=1800)
    total = num_actors * len(prompts)
    start = time.perf_counter()
    for _ in range(num_actors):  # least-loaded dispatch hands each actor one full request mix
        for prompt in prompts:
            pool.submit(prompt, params)
    tokens, per_actor, last_report = 0, {}, start
    for _ in range(total):
        group = pool.get(timeout=3600)
        for sample in group.samples:
            if sample.error:
                raise RuntimeError(f"actor {sample.actor}: {sample.error}")
            tokens += len(sample.token_ids)
            per_actor[sample.actor] = per_actor.get(sample.actor, 0) + len(sample.token_ids)
        if time.perf_counter() - last_report > 60:
            last_report = time.perf_counter()
            print(f"[scale]   ... {last_report - start:.0f} s, {tokens:,} tokens", flush=True)
    wall = time.perf_counter() - start
    stats = pool.actor_metrics()
    return {
        "actors": num_actors,
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "tokens_per_actor": {str(k): v for k, v in sorted(per_actor.items())},
        "gpu_busy_per_actor": [s.get("gpu_busy") for s in stats.values()],
    }


def run_weight_sync(pool, workload, repeats: int, device: str, backends: list[str]) -> list:
    """One timing per backend, each with its own process group, all in this one run."""
    import torch

    from benchmarks.lib.workloads import build_model

    model = build_model(workload.model, workload.dtype, device)  # the "trainer's" copy
    named = list(model.named_parameters())
    results = []
    for backend in backends:
        times = []
        for _ in range(repeats + 1):
            pool.pause()
            result = pool.sync_weights(named, backend=backend)
            pool.resume()
            times.append(result["seconds"])
            print(f"[scale]   sync over {backend}: {times[-1]:.3f} s", flush=True)
        results.append(
            {
                "backend": backend,
                "gib": result["bytes"] / 2**30,
                "first_sync_s": times[0],
                "sync_s": times[1:],
                "median_sync_s": statistics.median(times[1:]),
            }
        )
    del model, named
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return results


def sync_backends(choice: str, num_gpus: int, shared_gpu: bool) -> list[str]:
    auto = "cuda_ipc" if shared_gpu else "nccl" if num_gpus else "gloo"
    backends = [auto if b == "auto" else b for b in choice.split(",") if b]
    allowed = {"gloo", auto}
    if any(b not in allowed for b in backends):
        raise SystemExit(
            f"--sync-backend {choice}: this layout can use {sorted(allowed)} (cuda_ipc needs the "
            "trainer and the actor on one GPU, nccl a GPU each)"
        )
    return backends


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workload", default="w1", help="a bench_rollout.py workload")
    parser.add_argument("--smoke", action="store_true", help="tiny model, CPU actors")
    parser.add_argument("--actors", default="1,2", help="comma-separated actor counts")
    parser.add_argument("--sync-repeats", type=int, default=3, help="0: no weight-sync timing")
    parser.add_argument(
        "--sync-backend",
        default="auto",
        help="comma-separated, each timed in turn: auto (nccl / cuda_ipc on one GPU / gloo), gloo",
    )
    parser.add_argument("--no-throughput", action="store_true", help="weight sync only")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--json-out", default="")
    args = parser.parse_args(argv)

    import ray
    import torch

    from benchmarks.lib.report import commit_id
    from benchmarks.lib.workloads import WORKLOADS, write_model_config
    from rollout import EngineConfig
    from rollout.actors.pool import RolloutPool
    from trainers.job.seats_on_ray import ray_sees

    name = "smoke" if args.smoke else args.workload
    if name not in WORKLOADS:
        raise SystemExit(f"unknown workload {name!r}; choose from {sorted(WORKLOADS)}")
    workload = WORKLOADS[name]
    num_gpus = torch.cuda.device_count() if workload.device == "cuda" else 0
    counts = [int(c) for c in args.actors.split(",") if c]
    if workload.device == "cuda" and max(counts) > num_gpus:
        raise SystemExit(f"--actors {args.actors} needs {max(counts)} GPUs; {num_gpus} visible")
    g = torch.Generator().manual_seed(0)
    vocab = min(16000, workload.model["vocab_size"])
    prompts = [
        torch.randint(0, vocab, (workload.prompt_len,), generator=g).tolist()
        for _ in range(workload.num_requests)
    ]
    folder = write_model_config(workload.model, tempfile.mkdtemp(prefix="bench-scale-"))
    engine = EngineConfig(
        model=folder,
        load_format="dummy",
        device=workload.device,
        dtype=workload.dtype,
        max_model_len=workload.max_model_len,
        max_num_seqs=workload.num_requests,
        gpu_memory_utilization=args.gpu_memory_utilization,
        **workload.engine,
    )
    report = {
        "workload": name,
        "device": torch.cuda.get_device_name() if num_gpus else "cpu",
        "gpus": num_gpus,
        "date": datetime.date.today().isoformat(),
        "commit": commit_id(),
        "command": " ".join(sys.argv),
        "runs": [],
    }
    for n in counts:
        print(f"[scale] {name}: {n} actor(s) ...", flush=True)
        # One GPU: the trainer and a single actor share it, as the GRPO job places them.
        shared = args.sync_repeats > 0 and num_gpus == 1 and n == 1
        sync = args.sync_repeats > 0 and (num_gpus == 0 or n < num_gpus or shared)
        backends = sync_backends(args.sync_backend, num_gpus, shared) if sync else []
        # With a sync to time on separate GPUs, the trainer keeps GPU 0 and Ray sees the others.
        separate = sync and num_gpus > 1
        with ray_sees(list(range(1, num_gpus)) if separate else None):
            ray.init(
                address="local",
                num_gpus=num_gpus - 1 if separate else num_gpus,
                include_dashboard=False,
                configure_logging=False,
            )
        actor_engine = engine
        if shared:
            util = min(engine.gpu_memory_utilization, 0.45)
            actor_engine = dataclasses.replace(engine, gpu_memory_utilization=util)
        gpus_per_actor = (0.5 if shared else 1.0) if num_gpus else 0.0
        pool = RolloutPool(actor_engine, n, num_gpus_per_actor=gpus_per_actor)
        try:
            run: dict = {"actors": n}
            if not args.no_throughput:
                run = run_throughput(pool, workload, n, prompts)
            if sync:
                trainer_device = "cuda:0" if num_gpus else "cpu"
                run["weight_sync"] = run_weight_sync(
                    pool, workload, args.sync_repeats, trainer_device, backends
                )
            report["runs"].append(run)
        finally:
            pool.shutdown()
            ray.shutdown()
        _print_run(report["runs"][-1])
        _finish(report, args.json_out)
    _print_table(report)


def _finish(report: dict, json_out: str) -> None:
    base = next((r for r in report["runs"] if r.get("actors") == 1 and "tokens_per_s" in r), None)
    for r in report["runs"]:
        if base is not None and "tokens_per_s" in r:
            r["efficiency"] = r["tokens_per_s"] / (r["actors"] * base["tokens_per_s"])
    if json_out:
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(json_out).write_text(json.dumps(report, indent=1))


def _print_run(r: dict) -> None:
    parts = [f"[scale]   {r['actors']} actor(s):"]
    if "tokens_per_s" in r:
        parts.append(f"{r['tokens_per_s']:,.0f} tok/s over {r['wall_s']:.1f} s")
    for w in r.get("weight_sync", []):
        parts.append(
            f"sync {w['gib']:.1f} GiB over {w['backend']}: {w['median_sync_s']:.3f} s"
            f" (first {w['first_sync_s']:.2f} s)"
        )
    print(" ".join(parts), flush=True)


def _print_table(report: dict) -> None:
    print(
        f"\n{report['workload']} on {report['device']} (commit {report['commit']}, {report['date']})"
    )
    print("| actors | tok/s | efficiency | sync backend | weight sync (median) | first sync |")
    print("|---|---|---|---|---|---|")
    for r in report["runs"]:
        tps = f"{r['tokens_per_s']:,.0f}" if "tokens_per_s" in r else "-"
        eff = f"{r['efficiency']:.3f}" if "efficiency" in r else "-"
        for w in r.get("weight_sync") or [{}]:
            backend = w.get("backend", "-")
            sync = f"{w['median_sync_s']:.3f} s" if w else "-"
            first = f"{w['first_sync_s']:.2f} s" if w else "-"
            print(f"| {r['actors']} | {tps} | {eff} | {backend} | {sync} | {first} |")


if __name__ == "__main__":
    main()
