"""Diagnose the trainer -> actor NCCL weight sync on a machine with two or more GPUs.

    NCCL_DEBUG=WARN python benchmarks/gpu/check_nccl.py [--gib 1] [--timeout-s 90]

Runs a broadcast through our `WeightGroup` between two processes in each GPU-visibility layout
the job can produce, then checks that a Ray actor started with `ray_sees([1])` lands on GPU 1:

  all-visible   both processes see every GPU (rank r uses cuda:r): torchrun's layout
  asymmetric    the trainer sees every GPU and uses cuda:0; the actor sees only GPU 1 (the job's
                layout: Ray sets the actor's CUDA_VISIBLE_DEVICES)
  one-each      the trainer sees only GPU 0, the actor only GPU 1
  asymmetric+no-p2p / +no-cumem   the job's layout with NCCL_P2P_DISABLE=1 / NCCL_CUMEM_ENABLE=0

Each case prints ok with the time per broadcast and GB/s, an error, or "hang" (killed after
--timeout-s). Nothing here is needed to use the project; it narrows down a sync that fails.
Needs two GPUs, and ray importable for the placement check.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

LAYOUTS = {
    "all-visible": (("0,1", 0), ("0,1", 1)),
    "asymmetric": (("0,1", 0), ("1", 0)),
    "one-each": (("0", 0), ("1", 0)),
}
# Layout variants with extra NCCL settings: CUDA IPC between processes that see different GPU
# sets has been a known trouble spot; without P2P, NCCL goes through shared host memory.
VARIANTS = {
    "asymmetric+no-p2p": ("asymmetric", {"NCCL_P2P_DISABLE": "1"}),
    "asymmetric+no-cumem": ("asymmetric", {"NCCL_CUMEM_ENABLE": "0"}),
}


def _rank(
    rank, visible: str, device: int, env: dict, port: int, gib: float, timeout_s, backend, out
):
    os.environ["CUDA_VISIBLE_DEVICES"] = visible  # before CUDA starts in this process
    os.environ.update(env)
    try:
        import torch

        from rollout.weight_sync import WeightGroup

        cuda = backend == "nccl"
        if cuda:
            torch.cuda.set_device(device)
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        group = WeightGroup("127.0.0.1", port, rank, 2, backend, timeout_s=timeout_s)
        numel = int(gib * 2**30 / 2)
        value = 1.0 if rank == 0 else 0.0
        flat = torch.full((numel,), value, dtype=torch.bfloat16, device="cuda" if cuda else "cpu")
        times = []
        for _ in range(3):
            sync()
            start = time.perf_counter()
            group.broadcast(flat)
            sync()
            times.append(time.perf_counter() - start)
        ok = bool((flat == 1.0).all())
        out.put((rank, "ok" if ok else "wrong values", min(times)))
    except Exception as err:  # noqa: BLE001 - reported, not raised: the other cases still run
        out.put((rank, f"{type(err).__name__}: {err}", None))


def check_layout(name: str, gib: float, timeout_s: float, backend: str = "nccl") -> str:
    from rollout.weight_sync import free_port

    layout, env = VARIANTS.get(name, (name, {}))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_rank, args=(r, visible, device, env, port, gib, timeout_s, backend, out)
        )
        for r, (visible, device) in enumerate(LAYOUTS[layout])
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s + 30
    for p in procs:
        p.join(max(1.0, deadline - time.monotonic()))
    if any(p.is_alive() for p in procs):
        for p in procs:
            p.kill()
        return "hang"
    results = []
    while not out.empty():
        results.append(out.get())
    results.sort()
    if len(results) < len(procs):  # a rank died without reporting (NCCL's watchdog, a crash)
        codes = [p.exitcode for p in procs]
        return f"rank(s) exited without a result (exit codes {codes}); reported: {results}"
    status = {status for _, status, _ in results}
    if status != {"ok"}:
        return "; ".join(f"rank {r}: {s}" for r, s, _ in results)
    seconds = max(t for _, _, t in results)
    return f"ok: {seconds * 1e3:.1f} ms per {gib:g} GiB broadcast ({gib * 2**30 / seconds / 1e9:.0f} GB/s)"


def check_ray_placement() -> str:
    import ray

    from trainers.job.seats_on_ray import ray_sees

    with ray_sees([1]):
        ray.init(address="local", num_gpus=1, include_dashboard=False, configure_logging=False)
    try:

        @ray.remote(num_gpus=1)
        def visible() -> str:
            return os.environ.get("CUDA_VISIBLE_DEVICES", "")

        return (
            f"actor sees CUDA_VISIBLE_DEVICES={ray.get(visible.remote(), timeout=60)!r} (want '1')"
        )
    except Exception as err:  # noqa: BLE001
        return f"{type(err).__name__}: {err}"
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--timeout-s", type=float, default=90.0)
    parser.add_argument("--layouts", default=",".join([*LAYOUTS, *VARIANTS]))
    parser.add_argument("--backend", default="nccl", help="gloo: check this script on CPU")
    args = parser.parse_args()
    for name in args.layouts.split(","):
        result = check_layout(name, args.gib, args.timeout_s, args.backend)
        print(f"[{args.backend}] {name}: {result}", flush=True)
    if args.backend == "nccl":
        print(f"[nccl] ray placement: {check_ray_placement()}", flush=True)


if __name__ == "__main__":
    main()
