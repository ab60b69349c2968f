"""profiling/combine_rows_error.py (CPU): the error narrower per-slot rows add to the down GEMM's combine."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "profiling"))

import combine_rows_error  # noqa: E402


def test_bf16_rows_add_error_the_fp32_rows_do_not():
    r = combine_rows_error.errors(32, seed=4, experts=8, hidden=256, inter=128, top_k=2)
    # FP32 rows: the output's own BF16 rounding is the whole error (the FP32 sums are far finer)
    assert abs(r["fp32_rows"] - r["output_rounding_alone"]) <= 0.05 * r["output_rounding_alone"]
    assert 1e-3 < r["output_rounding_alone"] < 2e-3  # BF16's relative rounding error, ~2^-9 / sqrt(3) rms
    assert r["bf16_rows"] > 1.2 * r["fp32_rows"]  # a second rounding per slot
    # FP16 scaled per 16 columns: 3 more bits than BF16, so ~1/8 of its added error
    assert r["fp32_rows"] <= r["scaled_fp16_rows"] <= 1.03 * r["fp32_rows"]
    assert r["fp32_rows"] <= r["fp16_pair_rows"] <= 1.03 * r["fp32_rows"]  # the stored rows


def test_scaled_fp16_keeps_every_block_in_range():
    ys = torch.randn(3, 32) * torch.tensor([1e-30, 1.0, 1e30]).unsqueeze(1)  # FP16 alone: 0, exact-ish, inf
    got = combine_rows_error.scaled_fp16(ys)
    assert torch.isfinite(got).all()
    assert ((got - ys).abs() <= ys.abs().reshape(3, 2, 16).amax(-1, keepdim=True).expand(3, 2, 16).reshape(3, 32)
            * 2.0 ** -11).all()
