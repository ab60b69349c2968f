"""The down GEMM's per-slot rows as scaled FP16 pairs (moe_slot_rows): encoding, range, and the combine's CPU path."""

import pytest
import torch

from trace_kernels import moe_gemm as ops
from trace_kernels import moe_gemm_ref as ref
from trace_kernels.moe_slot_rows import SlotRows, decode_slot_rows, empty_slot_rows, encode_slot_rows


def _rows(seed: int, m: int = 37, h: int = 256) -> torch.Tensor:
    """float32 [m, h] over ~70 binary orders of magnitude, a different one per 16-column block."""
    gen = torch.Generator().manual_seed(seed)
    scale = 2.0 ** torch.randint(-40, 30, (m, h // 16, 1), generator=gen).float()  # [m, h/16, 1]
    return (torch.randn(m, h // 16, 16, generator=gen) * scale).reshape(m, h)


@pytest.mark.parametrize("seed", [1, 2])
def test_each_pair_is_fp16_rounding_of_its_scaled_values(seed):
    ys = _rows(seed)
    enc = encode_slot_rows(ys)
    m, h = ys.shape
    assert enc.values.dtype == torch.float16 and enc.exponents.dtype == torch.int8
    assert tuple(enc.values.shape) == (m, h) and tuple(enc.exponents.shape) == (m, h // 2)
    amax = enc.values.float().abs().reshape(m, h // 2, 2).amax(-1)  # [m, h/2]: stored pairs are adjacent
    assert ((amax >= 2 ** 14) & (amax <= 2 ** 15)).all()  # the pair's larger value uses FP16's top binade
    # the stored order: block b's pair j (columns 16b + j, 16b + j + 8) at 16b + 2j, 16b + 2j + 1
    scale = 2.0 ** enc.exponents.double().repeat_interleave(2, dim=1)  # [m, h] in stored order
    stored = (enc.values.double() * scale).reshape(m, h // 16, 8, 2)
    assert torch.equal(stored.transpose(2, 3).reshape(m, h).float(), decode_slot_rows(enc))
    # each element: within half an FP16 ulp of the exact value (relative 2^-11 at worst, FP16 normals here)
    got = decode_slot_rows(enc)
    pairs_amax = torch.maximum(ys.reshape(m, h // 16, 2, 8)[:, :, 0].abs(), ys.reshape(m, h // 16, 2, 8)[:, :, 1].abs())
    pairs_amax = pairs_amax.unsqueeze(2).expand(m, h // 16, 2, 8).reshape(m, h)  # [m, h]: each column's pair amax
    assert ((got - ys).abs() <= pairs_amax * 2.0 ** -11).all()
    assert ((got - ys).abs() <= ys.abs() * 2.0 ** -11 + pairs_amax * 2.0 ** -24).all()


def test_the_exponent_keeps_every_finite_float32_in_range():
    ys = torch.zeros(4, 64)
    ys[0, :16] = 1e38 * torch.linspace(-1, 1, 16)  # (within FP16 rounding of FLT_MAX a value would round to inf)
    ys[1, :16] = torch.finfo(torch.float32).tiny  # the smallest normal: the exponent's lower clamp
    ys[1, 16:32] = 2.0 ** -149  # the smallest subnormal
    ys[2, :] = torch.linspace(-3e5, 3e5, 64)  # beyond FP16's 65504
    # row 3 and the rest: zeros
    enc = encode_slot_rows(ys)
    got = decode_slot_rows(enc)
    assert torch.isfinite(got).all()
    assert torch.allclose(got[0, :16], ys[0, :16], rtol=2 ** -11, atol=0)
    assert torch.allclose(got[2], ys[2], rtol=2 ** -11, atol=ys[2].abs().max().item() * 2 ** -24)
    assert enc.exponents[0, 0] == 253 - 141  # the pair (0, 8): -1e38, whose biased exponent is 253
    assert enc.exponents[1, :16].eq(-126).all() and enc.exponents[3].eq(-126).all()  # clamped; zero pairs too
    assert torch.equal(got[1, :32], ys[1, :32]) and got[3].eq(0).all()  # exact down to FP32's subnormals


def test_non_finite_values_stay_non_finite():
    ys = torch.randn(2, 32)
    ys[0, 3], ys[1, 20] = float("inf"), float("nan")
    got = decode_slot_rows(encode_slot_rows(ys))
    assert got[0, 3] == float("inf") and got[1, 20].isnan()
    finite = torch.ones_like(ys, dtype=torch.bool)
    finite[0, 3] = finite[1, 20] = False
    assert torch.isfinite(got[finite]).all()  # everything else (the partners 11 and 28 included: their scale is 2^113)


def test_encoding_rejects_bad_rows():
    with pytest.raises(ValueError, match="float32"):
        encode_slot_rows(torch.randn(4, 32, dtype=torch.float64))
    with pytest.raises(ValueError, match="H % 16"):
        encode_slot_rows(torch.randn(4, 24))
    with pytest.raises(ValueError, match="H % 16"):
        empty_slot_rows(4, 24, "cpu")


def test_moe_combine_cpu_sums_the_decoded_rows_in_slot_order():
    gen = torch.Generator().manual_seed(5)
    tokens, top_k, h = 9, 4, 128
    ys = encode_slot_rows(torch.randn(tokens * top_k, h, generator=gen))
    slot_rows = torch.randperm(tokens * top_k, generator=gen).to(torch.int32).reshape(tokens, top_k)
    got = ops.moe_combine(ys, slot_rows)
    rows = decode_slot_rows(ys)
    want = rows[slot_rows[:, 0].long()]
    for j in range(1, top_k):
        want = want + rows[slot_rows[:, j].long()]
    assert torch.equal(got, want.to(torch.bfloat16))
    with pytest.raises(ValueError, match="slot_rows values"):
        ops.moe_combine(ys, slot_rows - 1)
    with pytest.raises(ValueError, match="int32"):
        ops.moe_combine(ys, slot_rows.long())
    with pytest.raises(TypeError, match="SlotRows"):
        ops.moe_combine(decode_slot_rows(ys), slot_rows)
    with pytest.raises(ValueError, match="exponents"):
        ops.moe_combine(SlotRows(ys.values, ys.exponents[:-1]), slot_rows)


def test_down_reference_error_stays_within_the_budget():
    """The reference's down path with the stored rows against exact FP64 arithmetic (issue 4: 2e-3)."""
    from trace_kernels.moe_testing import make_problem
    p = make_problem(16, 256, 128, 4, 64, seed=3)
    a = torch.randn(p.routing.num_rows, 128, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)  # [M, I]
    got = ref.moe_down_ref(a, p.down, p.routing)
    exact = ref._grouped_scaled_matmul(a, p.down, p.routing.offsets, None, None, torch.float64)
    exact = (exact.double() * p.routing.row_weight.double().unsqueeze(1))[p.routing.slot_rows.long()].sum(1)
    rel = float((got.double() - exact).norm() / exact.norm())
    assert rel <= 2e-3


def test_moe_down_rejects_a_bad_workspace_before_anything_runs():
    """slot_workspace is checked ahead of the CPU / kernel dispatch, so a wrong one fails the same way on both."""
    from trace_kernels.moe_testing import make_problem
    p = make_problem(16, 256, 128, 4, 8, seed=5)
    m = p.routing.num_rows
    a = torch.randn(m, 128, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)  # [M, I]
    good = empty_slot_rows(m, 256, "cpu")
    assert ops.moe_down(a, p.down, p.routing, slot_workspace=good).shape == (8, 256)
    bad = [(torch.empty(m, 256), TypeError, "SlotRows"),  # the old FP32 workspace
           (SlotRows(good.values.float(), good.exponents), ValueError, "slot_workspace.values"),
           (SlotRows(good.values[:-1], good.exponents), ValueError, "slot_workspace.values"),
           (SlotRows(good.values, good.exponents[:, :-16]), ValueError, "slot_workspace.exponents"),
           (SlotRows(good.values, good.exponents.to(torch.uint8)), ValueError, "slot_workspace.exponents")]
    for workspace, error, match in bad:
        with pytest.raises(error, match=match):
            ops.moe_down(a, p.down, p.routing, slot_workspace=workspace)
