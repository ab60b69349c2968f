"""profiling/sweep_moe_gemm_tiles.py: tiles in --tiles form and the log summary device scripts print (CPU)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "profiling"))

import sweep_moe_gemm_tiles as sweep  # noqa: E402
from trace_kernels.codegen.ops import moe_gemm as codegen  # noqa: E402


def test_tile_text_reads_back():
    tiles = [t for _, t in codegen.TILE_TABLE + codegen.WS_TILE_TABLE] + list(codegen.EXTRA_TILES)
    for tile in tiles:
        assert sweep.explicit_tiles(sweep.tile_text(tile)) == [tile]
    assert sweep.tile_text(codegen.TileConfig(128, 2, chunks_per_stage=2, step_pipeline=True)) == \
        "tile_tokens=128,stages=2,chunks_per_stage=2,step_pipeline=1"


def test_summarize_log(tmp_path, capsys):
    tile = codegen.TileConfig(128, 4, 1, 2, variant="ws", m_tiles=2, quantize_after=True)
    lines = ["built 4 kernels",
             f"T=  4096 {tile} gate_up 0.5840 ms down 0.4050 ms bitwise equal to the first tile: True",
             "T=4096: best {'tokens': 4096}"]
    assert sweep.summarize_log(lines) == [
        "T=  4096 tile_tokens=128,stages=4,min_blocks=1,warpgroups=2,variant=ws,m_tiles=2,quantize_after=1 "
        "gate_up 0.5840 ms down 0.4050 ms bitwise equal to the first tile: True"]
    log = tmp_path / "sweep.log"
    log.write_text("\n".join(lines) + "\n")
    assert sweep.main(["--summarize", str(log)]) == 0
    assert capsys.readouterr().out.startswith("T=  4096 tile_tokens=128,stages=4,")
