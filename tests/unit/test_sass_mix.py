"""benchmarks/sass_mix.py: the hottest loop and the opcode mix from ncu's per-instruction CSV."""

from __future__ import annotations

import csv

import pytest

from benchmarks import sass_mix

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
          "stall_long_sb", "stall_wait", "stall_long_sb (Not Issued)"]  # fmt: skip


def _write(path, rows) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, quoting=csv.QUOTE_ALL)
        writer.writerow(["Kernel Name", "_decode_kernel", ""])
        writer.writerow(HEADER)
        writer.writerows(rows)


def test_the_hottest_loop_and_its_opcodes(tmp_path) -> None:
    rows = [
        ["0x0", "      LDC R1, c[0x0][0x28]", "3", "128", "1", "2", "9"],  # prologue: once a warp
        ["0x10", "      IMAD.MOV.U32 R12, RZ, RZ, R78", "5", "4096", "4", "1", "9"],
        ["0x20", "  @!P0 IMAD.MOV.U32 R13, RZ, RZ, R36", "0", "4096", "0", "0", "0"],
        ["0x30", "      HMMA.16816.F32 R52, R12, R52, RZ", "7", "4096", "2", "5", "0"],
        ["0x40", "      F2FP.F16.E4M3.UNPACK_B R52, R32", "1", "4096", "1", "0", "0"],
        ["0x50", "      BRA 0x10", "0", "4095", "0", "0", "0"],  # the back edge: one pass fewer
        ["0x60", "      EXIT", "0", "128", "0", "0", "0"],
    ]
    _write(tmp_path / "k.csv", rows)
    summary = sass_mix.summarize(*sass_mix.read_sass(tmp_path / "k.csv"))
    assert summary["kernel"] == "_decode_kernel"
    assert summary["warp_instructions"] == 128 + 4 * 4096 + 4095 + 128
    loop = summary["loop"]
    assert (loop["instructions_a_pass"], loop["passes"]) == (4, 4096)
    assert loop["by_opcode"] == {"IMAD": 2, "HMMA": 1, "F2FP": 1}
    assert loop["by_mnemonic"]["IMAD.MOV.U32"] == 2
    assert summary["stalls"] == pytest.approx({"long_sb": 8 / 16, "wait": 8 / 16})


def test_a_file_that_is_not_the_source_page_is_refused(tmp_path) -> None:
    (tmp_path / "x.csv").write_text('"ID","Kernel"\n"0","k"\n')
    with pytest.raises(SystemExit, match="not ncu's source page"):
        sass_mix.read_sass(tmp_path / "x.csv")


@pytest.mark.parametrize(
    "line, name",
    [("@!P0 IMAD.MOV.U32 R1, RZ, RZ, R2", "IMAD.MOV.U32"), ("@UP1 BRA 0x10", "BRA"),
     ("  LDS.64 R78, [R111+UR5+0x8000]", "LDS.64"), ("@PT EXIT ;", "EXIT")],
)  # fmt: skip
def test_opcodes_drop_the_predicate(line: str, name: str) -> None:
    assert sass_mix.opcode(line) == name
