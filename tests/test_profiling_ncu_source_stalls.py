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
