"""Benchmark output shared by the scripts: the commit measured, tables, and plots."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def commit_id() -> str:
    # A benchmark may run on a copy of the working tree whose .git (if any) is stale: a commit
    # passed in ROLLOUT_COMMIT wins.
    if os.environ.get("ROLLOUT_COMMIT"):
        return os.environ["ROLLOUT_COMMIT"]
    try:
        sha = _git("rev-parse", "--short", "HEAD")
        # Tracked files that differ from HEAD: the figures are not that commit's.
        changed = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{sha}+dirty" if changed else sha


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()


def plot_runs(runs: list[dict], title: str, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    fig, (bars, lines) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [r["mode"] for r in runs]
    bars.bar(names, [r["tokens_per_s"] for r in runs], color="tab:blue")
    roof = next((r["roofline_tokens_per_s"] for r in runs if r.get("roofline_tokens_per_s")), None)
    if roof:
        bars.axhline(roof, color="tab:red", linestyle="--", label=f"roofline {roof:,.0f}")
        bars.legend()
    bars.set_ylabel("generated tokens/s")
    bars.set_title(title)
    for r in runs:
        if r.get("step_ms"):
            lines.plot(r["step_ms"], label=r["mode"], linewidth=0.7)
    lines.set_xlabel("step")
    lines.set_ylabel("ms per step (host clock)")
    lines.set_yscale("log")
    lines.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_run(r: dict) -> None:
    print(
        f"[bench]   {r['mode']}: {fmt(r.get('tokens_per_s'), ',.0f')} tok/s, "
        f"{fmt(r.get('ms_per_step'), '.2f')} ms/step, busy {fmt(r.get('gpu_busy'), '.1%')}, "
        f"cpu {fmt(r.get('cpu_ms_per_step'), '.2f')} ms/step",
        flush=True,
    )
    if r.get("touched_expert_roofline_tokens_per_s") is not None:
        print(
            f"[bench]     touched-expert roofline "
            f"{fmt(r['touched_expert_roofline_tokens_per_s'], ',.0f')} tok/s, "
            f"reached {fmt(r.get('touched_expert_roofline_fraction'), '.1%')}",
            flush=True,
        )
    if r.get("speculation"):
        spec = r["speculation"]
        print(
            f"[bench]     speculation: {spec['verifications']} verifications, "
            f"{spec['accepted']} of {spec['drafted']} drafts accepted "
            f"({spec['acceptance_rate']:.1%}), {spec['tokens_per_verification']:.2f} tokens each",
            flush=True,
        )
    if r.get("floor_bandwidth"):
        print(
            f"[bench]     roofline and floors at {r['floor_bandwidth'] / 1e12:.2f} TB/s "
            f"({r['floor_bandwidth_is']})",
            flush=True,
        )
    if "regimes" in r:  # a grpo run
        print(
            f"[bench]     floor {fmt(r.get('floor_s'), '.2f')} s ({fmt(r.get('floor_fraction'), '.1%')}"
            f" of the wall time), tail {r['tail_s']:.2f} s ({r['tail_share']:.1%}, "
            f"{r['tail_steps']} steps), KV blocks {_blocks(r)}",
            flush=True,
        )
        cells = [f"{name}: {_regime(reg)}" for name, reg in r["regimes"].items() if reg["steps"]]
        print(f"[bench]     running {' | '.join(cells)}", flush=True)


def print_table(report: dict) -> None:
    print(
        f"\n{report['workload']} on {report['device']} (commit {report['commit']}, {report['date']})"
    )
    print(
        "| mode | tok/s | ms/step | GPU busy | CPU ms/step | roofline tok/s | of roofline | peak GiB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in report["runs"]:
        if "error" in r:
            print(f"| {r['mode']} | error: {r['error'][:60]} |")
            continue
        print(
            f"| {r['mode']} | {fmt(r['tokens_per_s'], ',.0f')} | {fmt(r.get('ms_per_step'), '.2f')} "
            f"| {fmt(r.get('gpu_busy'), '.1%')} | {fmt(r.get('cpu_ms_per_step'), '.2f')} "
            f"| {fmt(r.get('roofline_tokens_per_s'), ',.0f')} | {fmt(r.get('roofline_fraction'), '.1%')} "
            f"| {fmt(r.get('peak_memory_gib'), '.1f')} |"
        )

    grpo_runs = [r for r in report["runs"] if "regimes" in r]
    if not grpo_runs:
        return
    names = [n for n in grpo_runs[0]["regimes"] if n != "0"]
    print(
        "\nBy samples running: steps x median ms/step (median floor ms/step); the tail is the "
        f"steps with fewer than 8. Lengths {_lengths(grpo_runs[0]['lengths'])}."
    )
    print(
        "| mode | floor s | of floor | tail s | tail share | KV blocks peak / one copy | "
        + " | ".join(names)
        + " |"
    )
    print("|---" * (6 + len(names)) + "|")
    for r in grpo_runs:
        print(
            f"| {r['mode']} | {fmt(r.get('floor_s'), '.2f')} | {fmt(r.get('floor_fraction'), '.1%')} "
            f"| {r['tail_s']:.2f} | {r['tail_share']:.1%} | {_blocks(r)} | "
            + " | ".join(_regime(r["regimes"][n]) for n in names)
            + " |"
        )


def _regime(regime: dict) -> str:
    if not regime["steps"]:
        return "-"
    return (
        f"{regime['steps']} x {fmt(regime['ms_per_step_median'], '.2f')} "
        f"({fmt(regime['floor_ms_per_step_median'], '.2f')})"
    )


def _blocks(r: dict) -> str:
    return (
        f"{r['kv_blocks_peak']} / {r['kv_blocks_one_copy_peak']} "
        f"({fmt(r.get('kv_blocks_ratio'), '.0%')})"
    )


def _lengths(lengths: dict) -> str:
    return (
        f"min {lengths['min']}, median {lengths['median']:.0f}, p90 {lengths['p90']:.0f}, "
        f"max {lengths['max']}, {lengths['total']:,} tokens"
    )
