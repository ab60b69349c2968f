"""Launch the fused gate_up and the down GEMM of one MoE layer a few times, for Nsight Compute.

    ncu --clock-control none --kernel-name regex:moe_gemm_ --launch-skip 2 --launch-count 2 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
        python profiling/moe_gemm_ncu_case.py --shape qwen3-30b-a3b --tokens 64
"""

import argparse
import sys

import torch

from bench_moe_gemm import random_packed_weights  # profiling/ is the script's folder
from trace_kernels import moe_gemm as ops, shapes
from trace_kernels.codegen.ops.moe_gemm import EXTRA_TILES
from trace_kernels.moe_routing import route
from trace_kernels.moe_testing import random_topk


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="qwen3-30b-a3b")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--variant", default=None, help="kernel variant (codegen TILE_TABLES key; default: DEFAULT_VARIANT)")
    parser.add_argument("--extra", type=int, default=None, help="use codegen EXTRA_TILES[EXTRA] instead of the table")
    parser.add_argument("--plain", action="store_true", help="also launch the plain gate_up GEMM (epilogue A/B)")
    parser.add_argument("--auto-tiles", action="store_true",
                        help="let each op pick its own tile per GEMM kind, as production calls do (default: one table "
                             "tile for both GEMMs)")
    args = parser.parse_args()
    s = shapes.resolve(args.shape)
    e, h, i, k, t = s.experts, s.hidden, s.intermediate, s.top_k, args.tokens
    gen = torch.Generator(device="cuda").manual_seed(0)
    w_up, w_down = random_packed_weights(e, 2 * i, h, gen), random_packed_weights(e, h, i, gen)
    routing = route(random_topk(t, e, k, torch.Generator().manual_seed(t)).cuda(), e,
                    torch.softmax(torch.randn(t, k, device="cuda", generator=gen), 1))
    x = torch.randn(t, h, device="cuda", generator=gen).to(torch.bfloat16)
    s_a = torch.rand(t, device="cuda", generator=gen) * 1e-2 + 1e-3
    tile = EXTRA_TILES[args.extra] if args.extra is not None else \
        None if args.auto_tiles else ops.tile_for_rows(routing.num_rows, e, args.variant)
    for _ in range(args.repeat):
        up = ops.moe_gate_up(x, w_up, routing.offsets, row_index=routing.row_index, row_scale=s_a, validate=False,
                             tile=tile)
        ops.moe_down(up.a_next, w_down, routing, row_scale=up.q.scale, validate=False, tile=tile)
        if args.plain:
            ops.moe_gemm(x, w_up, routing.offsets, row_index=routing.row_index, row_scale=s_a, validate=False,
                         tile=tile)
    torch.cuda.synchronize()
    print("tile", tile or "per kind (auto)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
