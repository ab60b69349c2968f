"""One small call of each MoE GEMM op against the reference (for compute-sanitizer runs).

    compute-sanitizer --tool memcheck python profiling/moe_gemm_smoke.py [--shape tiny] [--tokens 37]
"""

import argparse
import sys

import torch

from trace_kernels import moe_gemm as ops
from trace_kernels import moe_gemm_ref as ref
from trace_kernels import shapes
from trace_kernels.codegen.ops.moe_gemm import TILE_TABLES
from trace_kernels.moe_testing import make_problem


def rel(got, want):
    return float((got.double() - want.double()).norm() / want.double().norm())


def diagnose(name, got, want):
    """Where a wrong result is wrong: the pattern points at the layout or the pipeline."""
    bad = (got.float() - want.float()).abs() > 1e-2 * want.float().abs().max()  # [M, N]
    if not bool(bad.any()):
        return
    rows, cols = bad.nonzero(as_tuple=True)
    print(f"  {name}: {int(bad.sum())}/{bad.numel()} bad; first at {(int(rows[0]), int(cols[0]))}; "
          f"bad cols mod 64: {torch.bincount(cols % 64, minlength=64).tolist()}; "
          f"bad rows mod 8: {torch.bincount(rows % 8, minlength=8).tolist()}; "
          f"got {got.flatten()[:4].tolist()} want {want.flatten()[:4].tolist()}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="tiny")
    parser.add_argument("--tokens", type=int, default=37)
    parser.add_argument("--variants", default=",".join(TILE_TABLES), help="kernel variants (TILE_TABLES keys)")
    args = parser.parse_args()
    s = shapes.resolve(args.shape)
    p = make_problem(s.experts, s.hidden, s.intermediate, s.top_k, args.tokens, seed=1, device="cuda", skew=2.0)
    r = p.routing
    worst = 0.0
    for _, tile in [row for v in args.variants.split(",") for row in TILE_TABLES[v]]:
        y = ops.moe_gemm(p.a, p.gate_up, r.offsets, row_index=r.row_index, row_scale=p.s_a, tile=tile)
        want_y = ref.moe_gemm_ref(p.a, p.gate_up, r.offsets, row_index=r.row_index, row_scale=p.s_a)
        e1 = rel(y, want_y)
        diagnose("plain", y, want_y)
        up = ops.moe_gate_up(p.a, p.gate_up, r.offsets, row_index=r.row_index, row_scale=p.s_a, tile=tile)
        want = ref.moe_gate_up_ref(p.a, p.gate_up, r.offsets, row_index=r.row_index, row_scale=p.s_a)
        e2 = rel(up.h, want.h)
        exact = torch.equal(up.q.codes.cpu(), ref.quantize_swiglu(up.h.cpu()).q.codes)
        out = ops.moe_down(up.a_next, p.down, r, row_scale=up.q.scale, tile=tile)
        e3 = rel(out, ref.moe_down_ref(up.a_next, p.down, r, row_scale=up.q.scale))
        torch.cuda.synchronize()
        print(f"{tile.variant:3s} TN={tile.tile_tokens:3d} plain {e1:.2e}  gate_up h {e2:.2e} codes exact {exact}  down {e3:.2e}")
        worst = max(worst, e1, e2, e3, 0.0 if exact else 1.0)
    print("OK" if worst <= 2e-3 else "FAIL", worst)
    return 0 if worst <= 2e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
