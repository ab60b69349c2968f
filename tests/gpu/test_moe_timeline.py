"""profiling/moe_timeline.py on the GPU (marked gpu): the stamped builds of the layer's v1 GEMMs and combine give the
normal build's bits (run_case raises otherwise, outputs poisoned first), every CTA with a token tile stamps its points
in order on a real SM, and there is one such CTA per (token tile, weight tile). TRACE_KERNELS_TIMELINE_CUBINS: a
folder of stamped cubins built ahead (moe_timeline.py --build-only --shapes tiny), so that the test compiles none."""

import os
import sys
from pathlib import Path

import pytest
import torch

PROFILING = Path(__file__).resolve().parents[2] / "profiling"
sys.path.insert(0, str(PROFILING))

import bench_moe_gemm  # noqa: E402
import moe_timeline  # noqa: E402
from trace_kernels import shapes  # noqa: E402
from trace_kernels.codegen.ops import moe_gemm as codegen  # noqa: E402
from trace_kernels.moe_routing import token_tiles  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("tokens", [16, 64, 600])  # tiny's TN=8 ring and direct down tile; TN=32; TN=128
def test_stamped_layer_matches_and_stamps_in_order(tokens, tmp_path):
    shape = shapes.resolve("tiny")
    e, h, i = shape.experts, shape.hidden, shape.intermediate
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    weights = (bench_moe_gemm.random_packed_weights(e, 2 * i, h, gen),
               bench_moe_gemm.random_packed_weights(e, h, i, gen))
    workdir = Path(os.environ.get("TRACE_KERNELS_TIMELINE_CUBINS") or tmp_path)
    r = moe_timeline.run_case(shape, tokens, gen, weights, bench_moe_gemm.Timer(2, warmup=1), workdir, samples=1)
    assert set(r["kernels"]) == {"gate_up", "down", "combine"} and not r["unstamped"]
    fields = r["last_sample_ctas"]["fields"]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    layer = moe_timeline.Layer(shape, tokens, gen, weights)  # the same routing (seeded by T) for the tile counts
    offsets = layer.routing.offsets.cpu()
    for role, tile, n in (("gate_up", layer.tile, 2 * i), ("down", layer.down_tile, h)):
        rows = r["last_sample_ctas"]["rows"][role]
        with_tile = [row for row in rows if row[fields.index("tile_found")] >= 0]
        points = [fields.index(p) for p in ("entry", "tile_found", "waited", "first_data", "loop_done", "stored")]
        for row in with_tile:
            times = [row[p] for p in points]
            assert times == sorted(times) and min(times) >= 0, (role, row)
            assert 0 <= row[fields.index("smid")] < sms
        x_tiles = n // (64 * codegen.warpgroups_for(n, tile))
        assert len(with_tile) == token_tiles(offsets, tile.tile_tokens) * x_tiles, role
        s = r["samples"][-1][role]
        assert s["ctas_with_tile"] == len(with_tile)
        assert sum(s["main_loop_ctas"].values()) == pytest.approx(1.0, abs=1e-3)
    assert r["samples"][-1]["combine"]["ctas"] == tokens
