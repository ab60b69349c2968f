"""The NVFP4 / TRACE reference against brute-force definitions written independently here."""

import numpy as np
import pytest
import torch

from trace_kernels import nvfp4

GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


# ------------------------------------------------------------------------------------------
# Brute-force definitions (scalar, numpy float32): deliberately nothing shared with the module.
# ------------------------------------------------------------------------------------------

def brute_e2m1_code(y: float) -> int:
    """Nearest signed grid point; a tie goes to the even magnitude index; saturate at ±6."""
    magnitude = min(abs(y), 6.0)
    distances = [abs(magnitude - g) for g in GRID]
    best = min(distances)
    candidates = [m for m, dist in enumerate(distances) if dist == best]
    m = candidates[0] if len(candidates) == 1 else next(c for c in candidates if c % 2 == 0)
    return m | (0x8 if (y < 0 and m != 0) else 0)


def all_e4m3_values() -> list[float]:
    values = []
    for exponent in range(16):
        for mantissa in range(8):
            if exponent == 15 and mantissa == 7:
                continue  # NaN in e4m3fn
            if exponent == 0:
                values.append(mantissa / 8 * 2.0**-6)
            else:
                values.append((1 + mantissa / 8) * 2.0 ** (exponent - 7))
    return values


E4M3 = all_e4m3_values()


def brute_e4m3(v: float) -> float:
    """Round a non-negative value to the nearest e4m3 value, ties to an even mantissa, saturate 448."""
    if v >= 448.0:
        return 448.0
    best = min(abs(v - e) for e in E4M3)
    candidates = [i for i, e in enumerate(E4M3) if abs(v - e) == best]
    if len(candidates) == 1:
        return E4M3[candidates[0]]
    return E4M3[next(i for i in candidates if i % 2 == 0)]  # index parity = mantissa parity


def brute_quantize_row(row: np.ndarray):
    """Scalar float32 quantization of one row, following the definition's steps one by one."""
    f = np.float32
    s = f(np.max(np.abs(row))) / f(2688.0)
    codes, scales = [], []
    for start in range(0, row.size, 16):
        block = row[start:start + 16]
        if s == 0:
            b = f(0.0)
        else:
            b = f(brute_e4m3(float(f(np.max(np.abs(block))) / (f(6.0) * s))))
        d = f(b * s)
        scales.append(float(b))
        for v in block:
            codes.append(0 if d == 0 else brute_e2m1_code(float(f(v) / d)))
    return float(s), scales, codes


def value_of(code: int) -> float:
    return (-1.0 if code & 0x8 else 1.0) * GRID[code & 0x7]


# ------------------------------------------------------------------------------------------
# Exhaustive element tests
# ------------------------------------------------------------------------------------------

def test_every_code_decodes():
    codes4 = torch.arange(16, dtype=torch.uint8).repeat(2)  # [32]
    q = nvfp4.NVFP4Tensor(nvfp4.pack_codes(codes4), torch.ones(2, dtype=torch.float8_e4m3fn),
                          torch.tensor(1.0))
    decoded = nvfp4.dequantize(q)
    assert decoded[:16].tolist() == [value_of(c) for c in range(16)]
    assert decoded[8].item() == 0.0  # -0 decodes to zero


def test_every_bf16_value_in_range_rounds_to_nearest_even():
    bits = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16)
    values = bits.view(torch.bfloat16).float()
    values = values[torch.isfinite(values) & (values.abs() <= 8)]
    got = nvfp4.e2m1_round(values).tolist()
    expected = [brute_e2m1_code(v) for v in values.tolist()]
    mismatches = [(v, g, e) for v, g, e in zip(values.tolist(), got, expected) if g != e]
    assert not mismatches, mismatches[:10]
    assert len(expected) > 30000


def test_mantissa_bit_alternates_across_zero():
    signed_grid = [-6, -4, -3, -2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 3, 4, 6]
    bits = [brute_e2m1_code(v) & 1 for v in signed_grid]
    assert bits == [(i + 1) % 2 for i in range(15)]
    assert nvfp4.e2m1_round(torch.tensor(signed_grid)).tolist() == [brute_e2m1_code(v) for v in signed_grid]


def test_e4m3_rounding_saturation_and_underflow():
    rng = np.random.default_rng(1)
    samples = np.concatenate([
        rng.uniform(0, 500, 2000), 2.0 ** rng.uniform(-12, 9, 2000),
        np.array(E4M3), (np.array(E4M3[:-1]) + np.array(E4M3[1:])) / 2,  # exact ties
        [447.9, 448.0, 460.0, 464.0, 470.0, 1e6, 2.0**-10, 2.0**-10 * 1.0001, 2.0**-11, 1e-30, 0.0],
    ]).astype(np.float32)
    got = nvfp4.e4m3_round(torch.from_numpy(samples)).float().tolist()
    expected = [brute_e4m3(float(v)) for v in samples]
    assert got == expected
    assert nvfp4.e4m3_round(torch.tensor([1e9])).float().item() == 448.0  # saturates, no NaN
    assert nvfp4.e4m3_round(torch.tensor([2.0**-10])).float().item() == 0.0  # tie -> even (zero)
    assert nvfp4.e4m3_round(torch.tensor([2.0**-9])).float().item() == 2.0**-9  # smallest subnormal


# ------------------------------------------------------------------------------------------
# Whole-tensor quantization against the scalar definition
# ------------------------------------------------------------------------------------------

def _rows_for_definition_check():
    g = torch.Generator().manual_seed(7)
    rows = [
        torch.randn(64, generator=g) * 3,
        torch.randn(16, generator=g),  # single block
        torch.randn(48, generator=g) * torch.logspace(-8, 8, 48),  # large dynamic range
        torch.cat([torch.tensor([1e6]), torch.randn(31, generator=g) * 1e-3]),  # one huge outlier
        torch.zeros(32),
        torch.randn(32, generator=g) * 1e-38,  # tiny: scale underflows
    ]
    return rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_matches_scalar_definition(dtype):
    for row in _rows_for_definition_check():
        if dtype == torch.float16 and row.abs().max() > 6e4:
            continue
        x = row.to(dtype)
        q = nvfp4.quantize(x)
        s, scales, codes = brute_quantize_row(x.float().numpy())
        assert q.scale.item() == s
        assert q.block_scales.float().tolist() == scales
        assert nvfp4.unpack_codes(q.codes).tolist() == codes


def test_quantize_shapes_and_row_independence():
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    q = nvfp4.quantize(x)
    assert q.codes.shape == (3, 5, 32) and q.codes.dtype == torch.uint8
    assert q.block_scales.shape == (3, 5, 4) and q.block_scales.dtype == torch.float8_e4m3fn
    assert q.scale.shape == (3, 5) and q.scale.dtype == torch.float32
    alone = nvfp4.quantize(x[1, 2])
    assert torch.equal(alone.codes, q.codes[1, 2])
    assert torch.equal(alone.scale, q.scale[1, 2])


def test_tensor_scale():
    w = torch.randn(8, 32) * torch.linspace(0.1, 10, 8)[:, None]
    q = nvfp4.quantize(w, scale="tensor")
    assert q.scale.shape == ()
    assert q.scale.item() == np.float32(w.abs().max().item()) / np.float32(2688)
    rows_alone = nvfp4.quantize(w)
    assert not torch.equal(rows_alone.scale, q.scale.expand(8))


def test_pack_orders():
    codes4 = torch.tensor([[1, 2, 3, 4]], dtype=torch.uint8)
    assert nvfp4.pack_codes(codes4).tolist() == [[0x21, 0x43]]
    assert torch.equal(nvfp4.unpack_codes(nvfp4.pack_codes(codes4)), codes4)
    bits = torch.tensor([1, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0], dtype=torch.uint8)
    assert nvfp4.pack_bits(bits).tolist() == [0x81, 0x02]
    assert torch.equal(nvfp4.unpack_bits(nvfp4.pack_bits(bits)), bits)


def test_zero_row_has_zero_codes_and_scales():
    x = torch.zeros(2, 32)
    x[1] = torch.randn(32)
    q = nvfp4.quantize(x)
    assert q.scale[0].item() == 0
    assert q.codes[0].eq(0).all() and q.block_scales[0].float().eq(0).all()
    assert torch.equal(nvfp4.dequantize(q)[0], torch.zeros(32))


def test_dequantize_without_scale_is_exact_in_bf16():
    x = torch.randn(16, 128) * torch.logspace(-3, 3, 16)[:, None]
    q = nvfp4.quantize(x)
    unscaled32 = nvfp4.dequantize(q, apply_scale=False)
    unscaled16 = nvfp4.dequantize(q, torch.bfloat16, apply_scale=False)
    assert torch.equal(unscaled16.float(), unscaled32)
    # The row scale applied afterwards agrees with value * d up to one FP32 rounding (d = b * s is
    # rounded first in the definition).
    torch.testing.assert_close(unscaled32 * q.scale[:, None], nvfp4.dequantize(q), rtol=2.0**-22, atol=0)


# ------------------------------------------------------------------------------------------
# Validation
# ------------------------------------------------------------------------------------------

def test_non_finite_inputs_name_count_and_position():
    x = torch.randn(4, 32)
    x[2, 5] = float("nan")
    x[3, 0] = float("inf")
    with pytest.raises(ValueError, match=r"2 non-finite.*\(2, 5\)"):
        nvfp4.quantize(x)
    with pytest.raises(ValueError, match="non-finite"):
        nvfp4.fake_quantize(x)
    g = nvfp4.make_guidance(nvfp4.quantize(torch.randn(4, 32)))
    with pytest.raises(ValueError, match="non-finite"):
        nvfp4.guided_fake_quantize(x, g)


@pytest.mark.parametrize("bad, error", [
    (torch.randn(4, 24), ValueError),
    (torch.randn(4, 0), ValueError),
    (torch.randint(0, 5, (4, 32)), TypeError),
    (torch.tensor(3.0), ValueError),
])
def test_bad_inputs_rejected(bad, error):
    with pytest.raises(error):
        nvfp4.quantize(bad)


def test_bad_scale_mode_and_guidance_mode():
    with pytest.raises(ValueError, match="scale"):
        nvfp4.quantize(torch.randn(2, 16), scale="block")
    with pytest.raises(ValueError, match="mode"):
        nvfp4.make_guidance(nvfp4.quantize(torch.randn(2, 16)), mode="half")


def test_mismatched_guidance_rejected():
    g = nvfp4.make_guidance(nvfp4.quantize(torch.randn(4, 32)))
    with pytest.raises(ValueError, match="shape"):
        nvfp4.guided_fake_quantize(torch.randn(4, 48), g)
    with pytest.raises(ValueError, match="shape"):
        nvfp4.guided_fake_quantize(torch.randn(2, 32), g)
    with pytest.raises(ValueError):
        nvfp4.agreement(torch.zeros(2, 8, dtype=torch.uint8), torch.zeros(2, 4, dtype=torch.uint8))


# ------------------------------------------------------------------------------------------
# Guidance
# ------------------------------------------------------------------------------------------

def _worked_example_rows():
    # amax 21504 sets s = 21504 / 2688 = 8; the second block's amax 144 gives b = e4m3(144 / 48) = 3,
    # so d = 24 for the element under test at index 17.
    base = torch.zeros(32)
    base[0] = 21504.0
    base[16] = 144.0
    rollout, trainer = base.clone(), base.clone()
    rollout[17], trainer[17] = 59.76, 60.24
    return rollout, trainer


def test_worked_example():
    rollout, trainer = _worked_example_rows()
    q = nvfp4.quantize(rollout)
    assert q.scale.item() == 8.0 and q.block_scales[1].float().item() == 3.0
    assert nvfp4.dequantize(q)[17].item() == 48.0  # y = 2.49 -> 2
    assert nvfp4.fake_quantize(trainer)[17].item() == 72.0  # y = 2.51 -> 3 by round-to-nearest
    for mode in ("compact", "full"):
        guided = nvfp4.guided_fake_quantize(trainer, nvfp4.make_guidance(q, mode))
        assert guided[17].item() == 48.0


def test_guidance_sizes():
    q = nvfp4.quantize(torch.randn(10, 2048))
    compact = nvfp4.make_guidance(q)
    assert compact.mantissa_bits.shape == (10, 256)
    assert compact.nbytes == 10 * 4 + 10 * 128 + 10 * 256
    assert compact.bits_per_element == pytest.approx(1.5 + 32 / 2048)
    full = nvfp4.make_guidance(q, "full")
    assert full.bits_per_element == pytest.approx(4.5 + 32 / 2048)


def test_guided_zero_block_gives_zero():
    x_r = torch.zeros(2, 32)
    x_r[1] = torch.randn(32)
    g = nvfp4.make_guidance(nvfp4.quantize(x_r))
    out = nvfp4.guided_fake_quantize(torch.randn(2, 32), g)
    assert torch.equal(out[0], torch.zeros(32))


def test_straight_through_gradients():
    x = torch.randn(3, 32, requires_grad=True)
    g = nvfp4.make_guidance(nvfp4.quantize(x.detach()))
    (nvfp4.fake_quantize(x) * 2 + nvfp4.guided_fake_quantize(x, g) * 3).sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 5.0))
    xb = torch.randn(2, 16, dtype=torch.bfloat16)
    assert nvfp4.fake_quantize(xb).dtype == torch.bfloat16


def test_agreement_histogram():
    a = nvfp4.pack_codes(torch.tensor([[1, 2, 0, 9, 7, 15, 0, 8]], dtype=torch.uint8))
    b = nvfp4.pack_codes(torch.tensor([[1, 3, 8, 1, 7, 14, 9, 0]], dtype=torch.uint8))
    result = nvfp4.agreement(a, b)
    # signed indices a: 1 2 0 -1 7 -7 0 0 ; b: 1 3 0 1 7 -6 -1 0
    assert result["distance_histogram"] == {0: 4, 1: 2, 2: 1, -1: 1}
    assert result["equal_fraction"] == 0.5 and result["elements"] == 8
