"""The Triton launches a run makes, recorded under the interpreter and compiled for a GPU.

Triton's interpreter runs a kernel's logic as NumPy, so it cannot see what only the compiler
checks: a variable whose type changes across a loop, a shape that does not broadcast in the
compiled IR, an op the GPU backend lacks. `record_launches` notes each launch the interpreter
makes (the kernel, its arguments' types, its compile-time constants and launch options);
`python -m tests.triton_launches FILE` then compiles every distinct one for an H200 (sm_90)
ahead of time, on CPU, through Triton's own front end and layout passes; and each launch that
reads FP8 once more with bf16 activations (`bf16_twins`), whose FP8 reads take
`triton_fp8_widen`'s inline PTX, the interpreter cannot run, and each launch that rounds to FP8
with bf16 activations: those down to a cubin, through the PTX assembler Triton ships. With `--sass` each of those prints its registers and its two
largest loops' instructions by opcode, counted in the compiled code (`sass_summary`): what one
tile or K step costs, measured without a GPU (the counts hold for the Triton version installed;
the GPU machine's own is what its runs execute).
tests/unit/test_triton_interpreter.py runs both.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
from pathlib import Path

import torch

from rollout.kernels.triton_attention_tiles import fp16_keys

# Launch options the kernels pass beside their arguments.
_OPTIONS = ("num_warps", "num_stages", "num_ctas", "enable_fp_fusion")
# torch dtype -> Triton's pointer element name.
_POINTEE = {
    "torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16",
    "torch.int64": "i64", "torch.int32": "i32", "torch.int16": "i16", "torch.int8": "i8",
    "torch.uint8": "u8", "torch.bool": "i1", "torch.float8_e4m3fn": "fp8e4nv",
}  # fmt: skip


def record_launches(path: str) -> None:
    """From now on, note every interpreted launch; written to `path` at exit."""
    import atexit

    import torch
    import triton.runtime.interpreter as interpreter

    seen: dict[str, dict] = {}
    run = interpreter.InterpretedFunction.run

    def noting_run(self, *args, grid, warmup, **kwargs):
        params = inspect.signature(self.fn).parameters
        bound = dict(zip(params, args, strict=False))  # the rest come as keywords
        options = {k: v for k, v in kwargs.items() if k in _OPTIONS}
        bound.update({k: v for k, v in kwargs.items() if k not in _OPTIONS})
        values = {}
        for name, param in params.items():
            value = bound.get(name, param.default)
            # What a GPU launch specializes on besides types: pointers at 16-byte multiples and
            # integers divisible by 16 (Triton's `tt.divisibility`, which sets vector widths).
            if isinstance(value, torch.Tensor):
                values[name] = {"pointer": _POINTEE[str(value.dtype)],
                                "divisible": value.data_ptr() % 16 == 0}  # fmt: skip
            elif value is None or _is_constexpr(param):
                values[name] = {"value": value}
            else:  # a runtime scalar: its type and divisibility reach the compiled code
                values[name] = {"scalar": _scalar_type(value),
                                "divisible": isinstance(value, int) and value % 16 == 0}  # fmt: skip
        launch = {
            "module": self.fn.__module__, "kernel": self.fn.__name__,
            "args": values, "options": options,
        }  # fmt: skip
        seen.setdefault(json.dumps(launch, sort_keys=True), launch)
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    interpreter.InterpretedFunction.run = noting_run
    atexit.register(lambda: Path(path).write_text(json.dumps(list(seen.values()), indent=1)))


def compile_launches(
    launches: list[dict], through: str = "ttgir", cubins: list | None = None
) -> list[str]:
    """Compile each launch for sm_90 through Triton's front end and its GPU-layout passes
    (TTIR, then TTGIR: where a type or shape the interpreter let through is refused); with
    `through="cubin"` on through LLVM, PTX and the assembler (seconds a kernel on CPU; where
    inline PTX is checked), appending (launch, cubin bytes) to `cubins` if given. Returns one
    line per failure (empty: all compiled)."""
    import importlib

    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    failures = []
    for launch in launches:
        kernel = getattr(importlib.import_module(launch["module"]), launch["kernel"])
        signature, constants, attrs = {}, {}, {}
        for index, param in enumerate(kernel.params):
            recorded = launch["args"][param.name]
            if param.is_constexpr:
                signature[param.name] = "constexpr"
                constants[(index,)] = recorded.get("value")
            elif "pointer" in recorded:
                signature[param.name] = "*" + recorded["pointer"]
            elif "scalar" in recorded:
                signature[param.name] = recorded["scalar"]
            else:  # None: Triton makes the argument a constant
                signature[param.name] = "constexpr"
                constants[(index,)] = recorded["value"]
            if recorded.get("divisible"):
                attrs[(index,)] = [["tt.divisibility", 16]]
        source = ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=attrs)
        try:
            options = backend.parse_options(dict(launch["options"], **source.parse_options()))
            stages: dict = {}
            backend.add_stages(stages, options, source.language)
            context = ir.context()
            ir.load_dialects(context)
            backend.load_dialects(context)
            module = source.make_ir(
                target, options, backend.get_codegen_implementation(options),
                backend.get_module_map(), context,
            )  # fmt: skip
            metadata = {"hash": launch["kernel"], "target": target, **options.__dict__}
            for stage in _STAGES[: _STAGES.index(through) + 1]:
                module = stages[stage](module, metadata)
            if cubins is not None and through == "cubin":
                cubins.append((launch, module))
        except Exception as err:  # noqa: BLE001 - reported with the launch that failed
            shown = {kernel.params[i].name: v for (i,), v in constants.items()}
            failures.append(
                f"{launch['module']}.{launch['kernel']} {shown}: "
                f"{type(err).__name__}: {str(err)[-600:]}"
            )
    return failures


_STAGES = ("ttir", "ttgir", "llir", "ptx", "cubin")

# The activation pointers (the model's dtype) of the kernels that read FP8: fp32 in the
# interpreter's launches, bf16 in their twins.
_ACTIVATIONS = {
    "_decode_linear_kernel": ("x_ptr", "r_ptr", "y_ptr"),
    "_gate_up_kernel": ("x_ptr", "act_ptr"),
    "_down_kernel": ("act_ptr", "out_ptr"),
    "_decode_kernel": ("q_ptr", "out_ptr"),
    "_extend_kernel": ("q_ptr", "out_ptr"),
    "_rms_norm_rounded_kernel": ("x_ptr", "r_ptr", "w_ptr", "h_ptr", "y_ptr"),
    "_silu_mul_rounded_kernel": ("gu_ptr", "y_ptr"),
    "_round_rows_kernel": ("x_ptr", "y_ptr"),
    "_gate_up_silu_kernel": ("y_ptr",),
    "_round_by_parts_kernel": ("y_ptr",),
    "_qk_norm_rope_kernel": ("x_ptr", "qw_ptr", "kw_ptr", "cos_ptr", "sin_ptr", "out_ptr"),
}
_ROUNDINGS = (
    "_rms_norm_rounded_kernel",
    "_silu_mul_rounded_kernel",
    "_round_rows_kernel",
    "_round_by_parts_kernel",
)
# Kernels that round to the activations' dtype between their steps, as transformers does: the
# interpreter ran them in fp32, where those roundings vanish.
_DTYPE_ROUNDINGS = ("_qk_norm_rope_kernel", "_gate_up_silu_kernel")


def bf16_twins(launches: list[dict]) -> list[dict]:
    """Each distinct launch that read FP8 (weights or KV), with bf16 activations and the fast
    widening on, and each that rounded to FP8 or to the activations' dtype, with bf16
    activations: as a bf16 model on the GPU launches them."""
    twins = {}
    for launch in launches:
        args = launch["args"]
        reads_fp8 = args.get("FP8", {}).get("value") or args.get("FP8_KV", {}).get("value")
        rounds_to_fp8 = launch["kernel"] in _ROUNDINGS
        rounds_to_dtype = launch["kernel"] in _DTYPE_ROUNDINGS
        if not (reads_fp8 and "FAST_WIDEN" in args) and not rounds_to_fp8 and not rounds_to_dtype:
            continue
        twin = json.loads(json.dumps(launch))
        for name in _ACTIVATIONS[launch["kernel"]]:
            if twin["args"][name].get("pointer") == "fp32":  # FP8 activations stay FP8
                twin["args"][name] = {**twin["args"][name], "pointer": "bf16"}
        if rounds_to_fp8:  # rounded by the GPU's conversion instruction, as on the GPU
            twin["args"]["HW_E4M3"] = {"value": True}
            twins.setdefault(json.dumps(twin, sort_keys=True), twin)
            continue
        if rounds_to_dtype:
            twins.setdefault(json.dumps(twin, sort_keys=True), twin)
            continue
        twin["args"]["FAST_WIDEN"] = {"value": True}
        if "K_F16" in twin["args"]:  # the FP8 cache's K tiles as bf16 queries widen them
            twin["args"]["K_F16"] = {"value": fp16_keys(torch.zeros(1, dtype=torch.bfloat16), True)}
        for name, value in (("IEEE", False), ("DOT_PRECISION", "tf32")):
            if name in twin["args"]:
                twin["args"][name] = {"value": value}
        twins.setdefault(json.dumps(twin, sort_keys=True), twin)
    return list(twins.values())


def loops(sass: str) -> list[list[str]]:
    """The loops of `cuobjdump -sass` text, largest first: each backward branch's body, its
    instructions once each (a static count: which loop is hot, and how often it runs, only a
    profile says; a kernel's main loop is usually one of the two largest)."""
    lines = [
        (int(m.group(1), 16), m.group(2).strip())
        for m in re.finditer(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", sass, re.M)
    ]
    bodies = []
    for address, text in lines:
        branch = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", text)
        if branch and int(branch.group(1), 16) < address:
            start = int(branch.group(1), 16)
            bodies.append([t for a, t in lines if start <= a <= address])
    return sorted(bodies, key=len, reverse=True)


def sass_summary(cubin: bytes, shown_loops: int = 2) -> dict:
    """Registers, and the largest loops' instructions by opcode (`loops`), of an sm_90 cubin,
    read with the disassembler Triton ships."""
    import subprocess
    import tempfile
    from collections import Counter

    import triton

    from benchmarks.sass_mix import opcode

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True)
    registers = re.search(r"REG:(\d+)", usage.stdout)
    return {
        "registers": int(registers.group(1)) if registers else None,
        "loops": [
            dict(Counter(opcode(text).split(".")[0] for text in body).most_common())
            for body in loops(sass)[:shown_loops]
        ],
    }


def _is_constexpr(param: inspect.Parameter) -> bool:
    # The kernels' modules use postponed annotations: the annotation is the text "tl.constexpr".
    annotation = param.annotation
    return annotation in ("tl.constexpr", "triton.language.constexpr", "constexpr") or (
        getattr(annotation, "__name__", "") == "constexpr"
    )


def _scalar_type(value) -> str:
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"a kernel argument of type {type(value).__name__} ({value!r})")


# The compile-time constants that tell one launch of a kernel from another in --sass lines.
_SHOWN = ("KEYS_WIDE", "K_F16", "V_BY_TOKEN", "GROUP", "QUERY_LEN", "ROWS_PAD", "BLOCK_N",
          "HAS_WINDOW", "HAS_SOFTCAP", "HAS_SINKS", "FP8", "BLOCK_M")  # fmt: skip


if __name__ == "__main__":
    recorded = json.loads(Path(sys.argv[1]).read_text())
    problems = compile_launches(recorded)
    print(
        f"compiled {len(recorded) - len(problems)} of {len(recorded)} distinct launches for sm_90"
    )
    twins = bf16_twins(recorded)
    cubins: list = []
    twin_problems = compile_launches(twins, through="cubin", cubins=cubins)
    print(
        f"compiled {len(twins) - len(twin_problems)} of {len(twins)} bf16 twins of the FP8 "
        "launches to sm_90 cubins (the FP8 reads and roundings)"
    )
    for line in problems + twin_problems:
        print(line)
    if "--sass" in sys.argv[2:]:  # each twin's main loop, counted in its compiled code
        for launch, cubin in cubins:
            summary = sass_summary(cubin)
            shown = {k: v["value"] for k, v in launch["args"].items()
                     if k in _SHOWN and "value" in v}  # fmt: skip
            mixes = [
                f"{sum(mix.values())} ("
                + ", ".join(f"{op} {n}" for op, n in list(mix.items())[:8]) + ")"
                for mix in summary["loops"]
            ]  # fmt: skip
            options = launch["options"]
            print(f"{launch['kernel']} {shown} warps {options.get('num_warps')} stages "
                  f"{options.get('num_stages')}: {summary['registers']} registers; loops "
                  + "; ".join(mixes))  # fmt: skip
    sys.exit(1 if problems or twin_problems or not recorded or not twins else 0)
