"""What the per-slot rows' storage costs the down GEMM's numerics (CPU, reference arithmetic; no GPU needed).

The down GEMM writes each (token, slot) row [M, H] and the combine sums a token's top-k rows in slot order
(moe_gemm_ref.combine_slots). As FP32 they add nothing to the output's own BF16 rounding. Fewer bytes cut the combine's
reads (docs/moe_gemm.md, "Per-slot rows"): in BF16 every slot is rounded to 8 bits before the sum; in FP16 scaled by a
power of two per 16 columns (a block's largest value in [2^14, 2^15]; the forty-seventh session's first trial, b904888)
or per pair of columns (moe_slot_rows, what the kernels store since then) to 11 bits. This measures
||out - exact|| / ||exact|| on Qwen3-30B-A3B's down GEMM fed with the gate_up's own fused output, against issue 4's
2e-3 budget:

    python profiling/combine_rows_error.py --out profiling/results/combine_rows_error_cpu.json
"""

from __future__ import annotations

import argparse
import json

import torch

from trace_kernels import moe_gemm_ref as ref
from trace_kernels.moe_slot_rows import decode_slot_rows, encode_slot_rows
from trace_kernels.moe_testing import make_problem
from trace_kernels.testing.provenance import git_commit, utc_now


def rel(got: torch.Tensor, exact: torch.Tensor) -> float:
    return float((got.double() - exact).norm() / exact.norm())


def scaled_fp16(ys: torch.Tensor) -> torch.Tensor:
    """ys float32 [M, H] rounded as FP16 scaled by 2^s per 16 columns, s = clamp(exponent(block amax) - 14), back
    to float32."""
    m, h = ys.shape
    blocks = ys.reshape(m, h // 16, 16)  # [M, H/16, 16]
    biased = (blocks.abs().view(torch.int32).amax(-1, keepdim=True) >> 23) & 0xFF  # amax's biased exponent
    s = (biased - 127 - 14).clamp(-126, 113)  # [M, H/16, 1]
    return ((blocks * torch.pow(2.0, -s.float())).half().float() * torch.pow(2.0, s.float())).reshape(m, h)


def errors(tokens: int, seed: int, experts=128, hidden=2048, inter=768, top_k=8) -> dict:
    p = make_problem(experts, hidden, inter, top_k, tokens, seed=seed)
    up = ref.moe_gate_up_ref(p.a, p.gate_up, p.routing.offsets, row_index=p.routing.row_index, row_scale=p.s_a)
    slots = p.routing.slot_rows.long()  # [T, k]
    weight = p.routing.row_weight.unsqueeze(1)  # [M, 1]
    y64 = ref._grouped_scaled_matmul(up.a_next, p.down, p.routing.offsets, None, up.q.scale, torch.float64)
    exact = (y64 * weight.double())[slots].sum(1)  # [T, H]
    y32 = ref._grouped_scaled_matmul(up.a_next, p.down, p.routing.offsets, None, up.q.scale, torch.float32)
    ys = y32 * weight  # [M, H] the FP32 per-slot rows
    return {"tokens": tokens, "seed": seed,
            "output_rounding_alone": rel(exact.to(torch.bfloat16), exact),
            "fp32_rows": rel(ref.combine_slots(ys, p.routing.slot_rows), exact),
            "bf16_rows": rel(ref.combine_slots(ys.to(torch.bfloat16).float(), p.routing.slot_rows), exact),
            "scaled_fp16_rows": rel(ref.combine_slots(scaled_fp16(ys), p.routing.slot_rows), exact),
            "fp16_pair_rows": rel(ref.combine_slots(decode_slot_rows(encode_slot_rows(ys)), p.routing.slot_rows),
                                  exact)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default="64,256,1024")
    parser.add_argument("--out", default="")
    args = parser.parse_args(argv)
    rows = [errors(int(t), seed) for seed, t in enumerate(args.tokens.split(","), start=1)]
    for r in rows:
        print(f"T={r['tokens']}: output rounding alone {r['output_rounding_alone']:.2e}, FP32 rows "
              f"{r['fp32_rows']:.2e}, BF16 rows {r['bf16_rows']:.2e}, FP16 rows scaled per 16 columns "
              f"{r['scaled_fp16_rows']:.2e}, per pair (stored) {r['fp16_pair_rows']:.2e} (budget 2e-3)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"date": utc_now(), "commit": git_commit(), "shape": "qwen3-30b-a3b", "budget": 2e-3,
                       "command": "python profiling/combine_rows_error.py --out " + args.out, "results": rows}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
