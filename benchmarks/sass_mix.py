"""What a kernel's instructions are, from Nsight Compute's per-instruction counts.

    ncu --set full -k regex:'^_decode_kernel$' -c 1 -o decode \\
        python benchmarks/bench_attention.py --regimes --fp8-kv --points 64x4096 --choices "FP8 KV"
    ncu -i decode.ncu-rep --page source --print-source sass --csv > decode_sass.csv
    python benchmarks/sass_mix.py decode_sass.csv [--json-out mix.json]

(`bash benchmarks/gpu/gpu_fp8.sh profile-kv` does all three for the FP8 read's tile choices.)

Prints the launch's warp instructions, its hottest loop (the instructions executed the same
number of times that together issue the most: a kernel's main loop runs each of its
instructions once a pass) with its instructions a pass by opcode, and where the warps stalled
(the profiler's samples by reason). A decode kernel bound by its instruction count rather than
its bytes shows it here: how many instructions one tile costs, and which.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from collections import Counter
from pathlib import Path

_PREDICATE = re.compile(r"^@!?U?P[0-9T]+\s+")


def opcode(source: str) -> str:
    """The mnemonic of a SASS line, its predicate dropped ("@!P0 IMAD.MOV.U32 R1, ..." ->
    "IMAD.MOV.U32")."""
    parts = _PREDICATE.sub("", source.strip()).split()
    return parts[0].rstrip(";") if parts else "?"


def read_sass(path: Path) -> tuple[str, list[dict]]:
    """(kernel name, one dict per instruction: source, executed, samples, stalls by reason) from
    ncu's `--page source --print-source sass --csv` output."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if len(rows) < 2 or not rows[0] or rows[0][0] != "Kernel Name":
        raise SystemExit(f"{path}: not ncu's source page as CSV (--page source --csv)")
    kernel, header = rows[0][1], rows[1]
    column = {name: i for i, name in enumerate(header)}
    for needed in ("Source", "Instructions Executed"):
        if needed not in column:
            raise SystemExit(f"{path}: no {needed!r} column; was the report made with --set full?")
    stall_columns = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
    instructions = []
    for row in rows[2:]:
        if len(row) < len(header):
            continue

        def number(name: str, row=row) -> int:
            value = row[column[name]] if name in column else ""
            return int(value) if value.strip().isdigit() else 0

        instructions.append(
            {
                "source": row[column["Source"]].strip(),
                "executed": number("Instructions Executed"),
                "samples": number("Warp Stall Sampling (All Samples)"),
                "stalls": {name[len("stall_") :]: number(name) for name in stall_columns},
            }
        )
    return kernel, instructions


def summarize(kernel: str, instructions: list[dict]) -> dict:
    """Totals, the hottest loop's instructions a pass by opcode, and the stall reasons' shares."""
    total = sum(i["executed"] for i in instructions)
    issued_by_count = Counter()
    for i in instructions:
        if i["executed"]:
            issued_by_count[i["executed"]] += i["executed"]
    passes = max(issued_by_count, key=issued_by_count.get) if issued_by_count else 0
    loop = [i for i in instructions if passes and i["executed"] == passes]
    mnemonics = Counter(opcode(i["source"]) for i in loop)
    families = Counter()
    for name, count in mnemonics.items():
        families[name.split(".")[0]] += count
    stalls = Counter()
    for i in instructions:
        stalls.update(i["stalls"])
    sampled = sum(stalls.values())
    return {
        "kernel": kernel,
        "warp_instructions": total,
        "loop": {
            "instructions_a_pass": len(loop),
            "passes": passes,
            "share_of_all": len(loop) * passes / total if total else 0.0,
            "by_opcode": dict(families.most_common()),
            "by_mnemonic": dict(mnemonics.most_common()),
        },
        "stalls": {k: v / sampled for k, v in stalls.most_common() if v} if sampled else {},
    }


def print_summary(summary: dict, shown: int = 16) -> None:
    loop = summary["loop"]
    print(f"{summary['kernel']}: {summary['warp_instructions']:,} warp instructions")
    print(
        f"  hottest loop: {loop['instructions_a_pass']} instructions a pass x {loop['passes']:,} "
        f"passes ({loop['share_of_all']:.0%} of all)"
    )
    per_pass = loop["instructions_a_pass"] or 1
    print("  a pass by opcode: " + ", ".join(
        f"{name} {n} ({n / per_pass:.0%})" for name, n in list(loop["by_opcode"].items())[:shown]
    ))  # fmt: skip
    print("  most frequent forms: " + ", ".join(
        f"{name} {n}" for name, n in list(loop["by_mnemonic"].items())[:8]
    ))  # fmt: skip
    if summary["stalls"]:
        print("  warps' stall samples: " + ", ".join(
            f"{name} {share:.0%}" for name, share in list(summary["stalls"].items())[:10]
        ))  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("csv", nargs="+", help="ncu --page source --print-source sass --csv output")
    parser.add_argument("--json-out", default="")
    args = parser.parse_args(argv)
    summaries = []
    for path in args.csv:
        summary = summarize(*read_sass(Path(path)))
        summary["file"] = Path(path).name
        print_summary(summary)
        summaries.append(summary)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summaries, indent=1))


if __name__ == "__main__":
    sys.exit(main())
