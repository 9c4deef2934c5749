"""The FP8 activations' rounding kernels alone (`triton_rounded_rows`): the layer's rounding
norm (with the residual add), the rounding activation and the rounding alone (o's input), at a
decode step's rows, with and without the rounded rows in the activations' dtype (`with_rows`).

    python benchmarks/bench_rounding.py                     # Qwen3-8B's widths, 1 to 128 rows
    python benchmarks/bench_rounding.py --warps 8,16,32     # also other warps a program

Each time is the replay of a CUDA graph of 36 launches (one per layer of an 8B model) over the
number of launches (bench_gemm's `time_in_graph`), as a decode step runs them: a kernel of a few
microseconds, its inputs in L2 as the GEMM before it leaves them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LAYERS = 36


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,2,8,32,128", help="rows a launch, comma-separated")
    parser.add_argument("--hidden", type=int, default=4096, help="the norm's and o's input width")
    parser.add_argument("--intermediate", type=int, default=12288, help="the activation's width")
    parser.add_argument(
        "--warps", default="", help="warps a program to try beside the kernels' own (e.g. 8,16)"
    )
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args()

    import torch

    from benchmarks.bench_gemm import time_in_graph
    from benchmarks.lib.report import commit_id
    from rollout.kernels import triton_rounded_rows as kernels

    if not torch.cuda.is_available():
        raise SystemExit("bench_rounding.py times GPU kernels: run it on a machine with a GPU")
    own_outputs = kernels._outputs

    def launches(op: str, rows: int, with_rows: bool):
        g = torch.Generator(device="cuda").manual_seed(rows)
        n = args.intermediate if op == "activation" else args.hidden
        x = torch.randn(rows, 2 * n if op == "activation" else n, device="cuda", generator=g)
        x = x.bfloat16()
        residual = torch.randn(rows, n, device="cuda", generator=g).bfloat16()
        weight = torch.randn(n, device="cuda", generator=g).bfloat16()
        return {
            "norm": lambda _: kernels.launch_norm(
                x, weight, 1e-6, False, residual, None, with_rows
            ),
            "activation": lambda _: kernels.launch_silu_mul(x, False, None, with_rows),
            "round": lambda _: kernels.launch_round(x, False, None, with_rows),
        }[op]

    warps_tried = [0] + [int(w) for w in args.warps.split(",") if w]
    results = []
    print("| kernel | rows | warps | with rows us | without rows us |")
    print("|---|---|---|---|---|")
    for rows in [int(r) for r in args.rows.split(",")]:
        for op in ("norm", "activation", "round"):
            for warps in warps_tried:
                if warps:  # the same launch with another warps count
                    kernels._outputs = lambda *a, w=warps: (*own_outputs(*a)[:5], w)
                times = {
                    with_rows: 1000 * time_in_graph(launches(op, rows, with_rows), LAYERS)
                    for with_rows in (True, False)
                }
                kernels._outputs = own_outputs
                shown = f"{warps}" if warps else "own"
                results.append(
                    {
                        "kernel": op,
                        "rows": rows,
                        "warps": shown,
                        "with_rows_us": times[True],
                        "without_rows_us": times[False],
                    }  # fmt: skip
                )
                print(f"| {op} | {rows} | {shown} | {times[True]:.2f} | {times[False]:.2f} |")
    report = {
        "benchmark": "rounding",
        "device": torch.cuda.get_device_name(),
        "commit": commit_id(),
        "date": datetime.date.today().isoformat(),
        "hidden": args.hidden,
        "intermediate": args.intermediate,
        "results": results,
    }
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
