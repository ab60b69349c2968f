"""profiling/ncu_source_stalls.py: per-instruction stall samples from a source-page CSV (CPU, no ncu needed)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "profiling"))

import ncu_source_stalls as stalls  # noqa: E402


def _write(tmp_path, header, rows):
    path = tmp_path / "rep.source.csv"
    lines = ["==PROF== a note ncu prints first", ",".join(f'"{h}"' for h in header)]
    lines += [",".join(f'"{v}"' for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_ranks_instructions_and_sums_opcodes(tmp_path, capsys):
    header = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)"]
    rows = [["0x10", "HGMMA.64x128x16.F32.BF16 gdesc[UR4], R24", "1,200", "1,000"],
            ["0x20", "@!P0 BAR.SYNC.DEFER_BLOCKING 0x0", "600", "590"],
            ["0x30", "LOP3.LUT R1, R2, 0x81c081c0, RZ, 0xc0, !PT", "150", "20"],
            ["0x40", "LOP3.LUT R3, R4, 0x81c081c0, RZ, 0xc0, !PT", "50", "10"]]
    assert stalls.main([_write(tmp_path, header, rows), "--top", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("2000 samples in 'Warp Stall Sampling (All Samples)'")
    assert "60.00%" in out[1] and "0x10" in out[1] and "HGMMA" in out[1]
    assert "30.00%" in out[2] and "BAR.SYNC" in out[2] and len(out) == 4  # top 2, then the opcode line
    assert out[3] == "per opcode: HGMMA 60.0%, BAR 30.0%, LOP3 10.0%"
    # --column picks another sample column
    assert stalls.main([_write(tmp_path, header, rows), "--column", header[3], "--top", "1"]) == 0
    assert capsys.readouterr().out.startswith("1620 samples in 'Warp Stall Sampling (Not-issued Samples)'")


def test_unknown_layout_lists_the_headers(tmp_path, capsys):
    path = _write(tmp_path, ["Address", "Source", "Instructions Executed"], [["0x10", "NOP", "3"]])
    assert stalls.main([path]) == 2
    assert "Instructions Executed" in capsys.readouterr().out
    assert stalls.opcode("@!UP0 UIADD3 UR4, UR4, 0x1, URZ") == "UIADD3"


def test_source_page_of_nsight_compute_2025(tmp_path, capsys):
    """The export names the kernel on a line above the header, and has per-reason columns (stall_*, and their
    '(Not Issued)' copies, which are not counted as reasons): the header is found, each top instruction lists its
    largest reasons, and --split-loop separates the main loop from the code a CTA runs about once."""
    header = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_barrier",
              "stall_wait", "stall_barrier (Not Issued)"]
    rows = [["0x00", "LDC R1, c[0x0][0x28]", "10", "100", "0", "10", "99"],                # once per CTA
            ["0x10", "HGMMA.64x128x16.F32.BF16 R24, R88, gdesc[UR4], R24", "20", "800", "0", "20", "0"],
            ["0x20", "WARPGROUP.DEPBAR.LE gsb0, 0x0", "60", "800", "55", "5", "0"],
            ["0x30", "STG.E desc[UR4][R2.64], R5", "10", "100", "2", "8", "0"]]       # epilogue: once
    path = tmp_path / "rep.source.csv"
    lines = ['"Kernel Name","moe_gemm_x_sm90a",'] + [",".join(f'"{v}"' for v in r) for r in [header] + rows]
    path.write_text("\n".join(lines) + "\n")
    assert stalls.main([str(path), "--top", "1", "--split-loop"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("100 samples") and "WARPGROUP.DEPBAR" in out[1] and out[1].endswith("[barrier 55, wait 5]")
    assert out[3] == "split at 1.5 x the first instruction's 100 executions:"
    assert out[4] == "repeated (main loop): 2 instructions, 80.0% of samples"
    assert out[5] == "  reasons: barrier 55.0%, wait 25.0%"
    assert out[7] == "about once per CTA: 2 instructions, 20.0% of samples"
    assert out[8] == "  reasons: wait 18.0%, barrier 2.0%"
