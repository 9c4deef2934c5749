"""Two or more `grpo` runs of the same workload, compared step by step.

    python benchmarks/compare_steps.py bf16.json fp8.json fp8_kv.json
    python benchmarks/compare_steps.py a.json b.json --running 128,64,32,16,8,4,1

A grpo workload fixes every sample's length in advance and ignores EOS, so two runs of it go
through the same schedule: step i of one run decodes the same samples at the same contexts as
step i of the other, whatever the engine settings. That makes their per-step times (the reports'
`step_ms`) comparable one to one, which a run's regimes by running samples hide: this prints the
median ms per step of each run between the steps where the running samples drop under each
`--running` count, with the samples' context there and each run's ratio to the first.

The running count and context of a step are from the lengths the workload draws (every sample
admitted together, all prompts prefilled in the first steps): about right, to a step or two.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def load_run(path: str, mode: str) -> tuple[dict, list[float]]:
    """(the report, its `mode` run's step times in ms); refuses a report that is not grpo's."""
    report = json.loads(Path(path).read_text())
    if "length_distribution" not in report:
        raise SystemExit(f"{path}: not a grpo report (no length_distribution)")
    runs = [r for r in report["runs"] if r.get("mode") == mode and r.get("step_ms")]
    if not runs:
        raise SystemExit(f"{path}: no {mode!r} run with step times")
    return report, runs[0]["step_ms"]


def workload_key(report: dict) -> tuple:
    d = report["length_distribution"]
    return (
        report["num_requests"], report["group_size"], report["prompt_len"],
        d["median"], d["sigma"], d["min"], d["max"], d["seed"],
    )  # fmt: skip


def sample_lengths(report: dict) -> list[int]:
    from benchmarks.lib.workloads import GrpoWorkload

    num_prompts, group, prompt_len, median, sigma, low, high, seed = workload_key(report)
    workload = GrpoWorkload(
        "compare", report.get("shape_name") or "qwen3-8b", num_prompts=num_prompts,
        group_size=group, prompt_len=prompt_len, length_median=median, length_sigma=sigma,
        length_min=low, length_max=high, length_seed=seed,
    )  # fmt: skip
    return workload.sample_lengths()


def windows(lengths: list[int], num_steps: int, running: list[int]) -> list[tuple[int, int]]:
    """[first, end) step windows: a new one starts where the running samples drop under each of
    the `running` counts (the first step, the prefill's, is left out)."""
    cuts = {1, num_steps}
    longer = sorted(lengths, reverse=True)
    for count in running:
        if 0 < count <= len(longer):
            cuts.add(min(num_steps, max(1, longer[count - 1])))  # last step with `count` running
    edges = sorted(cuts)
    return [(a, b) for a, b in itertools.pairwise(edges) if b > a]


def compare(paths: list[str], mode: str, running: list[int]) -> list[dict]:
    import numpy as np

    loaded = [load_run(p, mode) for p in paths]
    first = loaded[0][0]
    for path, (report, _) in zip(paths[1:], loaded[1:], strict=True):
        if workload_key(report) != workload_key(first):
            raise SystemExit(f"{path}: another workload than {paths[0]}'s; the steps do not match")
    lengths = sample_lengths(first)
    steps = min(len(times) for _, times in loaded)
    rows = []
    for a, b in windows(lengths, steps, running):
        if not any(n > a for n in lengths):
            continue  # past the longest sample's length: the last step or two of a run
        medians = [float(np.median(times[a:b])) for _, times in loaded]
        rows.append({
            "steps": [a, b],
            "running": [sum(n > a for n in lengths), sum(n > b - 1 for n in lengths)],
            "context": [first["prompt_len"] + a, first["prompt_len"] + b - 1],
            "ms_per_step": medians,
            "seconds": [float(np.sum(times[a:b])) / 1e3 for _, times in loaded],
            "ratio": [m / medians[0] for m in medians],
        })  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("reports", nargs="+", help="bench_rollout.py --json-out reports")
    parser.add_argument("--mode", default="overlap", help="which run of each report")
    parser.add_argument(
        "--running",
        default="128,96,64,48,32,24,16,12,8,4,2,1",
        help="window edges: where the running samples drop under these counts",
    )
    parser.add_argument("--json-out", default="")
    args = parser.parse_args(argv)
    if len(args.reports) < 2:
        raise SystemExit("give two or more reports to compare")
    running = [int(c) for c in args.running.split(",") if c]
    rows = compare(args.reports, args.mode, running)
    names = [Path(p).stem for p in args.reports]
    print("| steps | running | context | " + " | ".join(f"{n} ms" for n in names) + " | "
          + " | ".join(f"{n} / {names[0]}" for n in names[1:]) + " |")  # fmt: skip
    print("|---" * (3 + 2 * len(names) - 1) + "|")
    for r in rows:
        (a, b), (ra, rb), (ca, cb) = r["steps"], r["running"], r["context"]
        print(
            f"| {a}-{b - 1} | {ra}-{rb} | {ca}-{cb} | "
            + " | ".join(f"{m:.2f}" for m in r["ms_per_step"])
            + " | "
            + " | ".join(f"{x:.3f}" for x in r["ratio"][1:])
            + " |"
        )
    totals = [sum(r["seconds"][i] for r in rows) for i in range(len(names))]
    print("seconds: " + ", ".join(f"{n} {t:.1f}" for n, t in zip(names, totals, strict=True)))
    if args.json_out:
        Path(args.json_out).write_text(
            json.dumps({"reports": args.reports, "windows": rows}, indent=1)
        )


if __name__ == "__main__":
    main()
