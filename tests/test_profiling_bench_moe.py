"""profiling/bench_moe_gemm.py's layer A/B arms (CPU: the tiles each `--variants` entry runs, no timing)."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "profiling"))

import bench_moe_gemm as bench  # noqa: E402
from sweep_moe_gemm_tiles import explicit_tiles  # noqa: E402
from trace_kernels import moe_routing  # noqa: E402
from trace_kernels.codegen.ops import moe_gemm as codegen  # noqa: E402

E, H, I = 128, 2048, 768  # qwen3-30b-a3b's down GEMM: N = H, K = I


def test_down_override_replaces_only_the_table_tile_of_its_width():
    tiles = explicit_tiles("tile_tokens=8,stages=1,min_blocks=8,warpgroups=1,weights_direct=2;"
                           "tile_tokens=16,stages=1,min_blocks=4,warpgroups=1,weights_direct=4")
    assert bench.variant_arm("auto") == ("auto", True, None, "")
    assert bench.variant_arm("auto:nopdl") == ("auto", False, None, "")
    variant, pdl, tn8, grid = bench.variant_arm("auto:down0", tiles)
    assert (variant, pdl, tn8, grid) == ("auto", True, tiles[0], "")
    tn16 = bench.variant_arm("auto:down1", tiles)[2]
    for rows_per_expert, override, want in ((4, tn8, tn8), (4, tn16, None), (8, tn16, tn16), (8, tn8, None),
                                            (0.05, tn8, None), (100, tn8, None)):
        m = int(rows_per_expert * E)
        table = codegen.tile_for_rows(m, E, "auto", k=I, kind="down_routed", n=H)
        assert bench.down_tile_for(m, E, "auto", I, H, override) == (want or table)
    with pytest.raises(ValueError, match="options"):
        bench.variant_arm("auto:fast", tiles)
    with pytest.raises(ValueError, match="has 2 tiles"):
        bench.variant_arm("auto:down2", tiles)


def test_grid_arms_launch_the_bound_before_or_the_real_tiles():
    assert bench.variant_arm("auto:loose") == ("auto", True, None, "loose")
    assert bench.variant_arm("auto_sp0:exact").grid == "exact"
    offsets = torch.tensor([0, 3, 3, 20, 21], dtype=torch.int32)  # 4 experts, rows 3, 0, 17, 1
    assert bench.grid_token_tiles("", offsets) is None  # the op's own bound
    assert bench.grid_token_tiles("loose", offsets)(21, 4, 8) == 3 + 4
    assert bench.grid_token_tiles("exact", offsets)(21, 4, 8) == 1 + 0 + 3 + 1
    assert moe_routing.token_tile_bound(21, 4, 8) == (21 + 4 * 7) // 8  # 6: between the two


def test_shape_list_takes_presets_configs_and_custom_shapes():
    assert bench.shape_list("qwen3-30b-a3b,qwen3-235b-a22b") == ["qwen3-30b-a3b", "qwen3-235b-a22b"]
    assert bench.shape_list("tiny, path/to/config.json") == ["tiny", "path/to/config.json"]
    custom = "E=32,H=2880,I=2880,k=4,hq=64,hkv=8,hd=64"
    assert bench.shape_list(custom) == [custom]
    assert bench.shape_list(f"{custom}; E=8,H=4096,I=14336,k=2,hq=32,hkv=8,hd=128;") == [
        custom, "E=8,H=4096,I=14336,k=2,hq=32,hkv=8,hd=128"]


def test_tuning_tiles_cover_auto_at_the_shapes_they_tune():
    """sweep_moe_gemm_tiles.py --tiles tuning: at the other shapes the tiles that build (odd K-chunk counts as rings of
    one chunk, as auto runs them) include every tile auto's tables pick there, so a tuned table is never worse than auto
    in the sweep's own measurement, bar the down GEMM's short-K direct TN=16 tile of Qwen3-30B-A3B."""
    from sweep_moe_gemm_tiles import TUNING_TILES, shape_tiles

    from trace_kernels import shapes
    kinds = ("gate_up_swiglu", "down_routed")
    for name in ("qwen3-235b-a22b", "E=8,H=4096,I=14336,k=2,hq=32,hkv=8,hd=128",
                 "E=128,H=2880,I=2880,k=4,hq=64,hkv=8,hd=64"):
        shape = shapes.resolve(name)
        tiles = shape_tiles(shape, explicit_tiles(TUNING_TILES), kinds)
        assert len(set(tiles)) == len(tiles) >= 6, name
        for tokens in (1, 2, 8, 32, 64, 128, 256, 1024, 4096, 16384):
            for kind in kinds:
                n, k = codegen.gemm_dims(shape, kind)
                auto = codegen.tile_for_rows(tokens * shape.top_k, shape.experts, k=k, kind=kind, n=n)
                assert auto in tiles or codegen.replace(auto, quantize_after=True) in tiles, (name, tokens, kind, auto)
