"""The ops on CPU tensors (reference dispatch), their fake impls, autograd and validation."""

from __future__ import annotations

import pytest
import torch

from trace_kernels import nvfp4, ops
from trace_kernels.ops.guided_fake_quantize import reference_counters


def test_quantize_cpu_matches_reference():
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    r = ops.quantize(x, guidance=True, dequant=True)
    ref = nvfp4.quantize(x)
    assert torch.equal(r.q.codes, ref.codes) and torch.equal(r.q.scale, ref.scale)
    assert torch.equal(r.q.block_scales.view(torch.uint8), ref.block_scales.view(torch.uint8))
    assert torch.equal(r.mantissa_bits, nvfp4.make_guidance(ref).mantissa_bits)
    assert torch.equal(r.dequant, nvfp4.dequantize(ref, torch.bfloat16, apply_scale=False))
    plain = ops.quantize(x)
    assert plain.mantissa_bits is None and plain.dequant is None
    with pytest.raises(ValueError, match="not requested"):
        plain.guidance()


def test_guided_cpu_counters_and_straight_through_grad():
    x_r = torch.randn(16, 128)
    full = nvfp4.make_guidance(nvfp4.quantize(x_r), "full")
    x_t = (x_r * (1 + 1e-2 * torch.randn_like(x_r))).requires_grad_()
    y, counters = ops.guided_fake_quantize(x_t, full, return_counters=True)
    assert torch.equal(y.detach(), nvfp4.guided_fake_quantize(x_t.detach(), full))
    elements, changed, guided_eq, nearest_eq = counters.tolist()
    assert elements == x_t.numel() and guided_eq == elements > nearest_eq and changed == elements - nearest_eq
    y.sum().backward()
    assert torch.equal(x_t.grad, torch.ones_like(x_t))
    compact = nvfp4.make_guidance(nvfp4.quantize(x_r))
    assert reference_counters(x_t.detach(), compact)[2:].tolist() == [0, 0]


def test_refit_cpu_in_place():
    w = torch.randn(3, 8, 32)
    out = ops.allocate_refit_buffers(3, 8, 32, "cpu")
    addresses = [out.codes.data_ptr(), out.block_scales.data_ptr(), out.scale.data_ptr()]
    assert ops.refit_weights(w, out) is out
    assert addresses == [out.codes.data_ptr(), out.block_scales.data_ptr(), out.scale.data_ptr()]
    for e in range(3):
        ref = nvfp4.quantize(w[e], scale="tensor")
        assert torch.equal(out.codes[e], ref.codes) and torch.equal(out.scale[e], ref.scale)
    # a non-finite expert (not the first) raises before any expert is written, and names w's index
    before = [t.clone() for t in (out.codes, out.block_scales.view(torch.uint8), out.scale)]
    w_bad = torch.randn(3, 8, 32)
    w_bad[1, 2, 3] = float("inf")
    with pytest.raises(ValueError, match=r"w has 1 non-finite element\(s\) .* index \(1, 2, 3\)"):
        ops.refit_weights(w_bad, out)
    assert all(torch.equal(a, b) for a, b in zip(before, (out.codes, out.block_scales.view(torch.uint8), out.scale)))


def test_fake_impls_trace_under_torch_compile():
    x = torch.randn(4, 64)

    def step(x):
        r = ops.quantize(x, guidance=True)
        return ops.guided_fake_quantize(x * 1.01, r.guidance())

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), step(x))
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        fake = torch.empty(2, 7, 32, device="meta")
        codes, scales, s, bits, dq = torch.ops.trace_kernels.nvfp4_quantize(fake, True, True)
        assert codes.shape == (2, 7, 16) and scales.dtype == torch.float8_e4m3fn and s.shape == (2, 7)
        assert bits.shape == (2, 7, 4) and dq.shape == (2, 7, 32) and dq.dtype == torch.bfloat16


def test_validation_errors():
    with pytest.raises(ValueError, match="multiple of 16"):
        ops.quantize(torch.randn(4, 24))
    with pytest.raises(TypeError, match="torch.Tensor"):
        ops.quantize([1.0] * 16)
    with pytest.raises(ValueError, match="non-finite"):
        ops.quantize(torch.tensor([[float("nan")] + [1.0] * 15]))
    g = nvfp4.make_guidance(nvfp4.quantize(torch.randn(2, 32)))
    with pytest.raises(ValueError, match="shape"):
        ops.guided_fake_quantize(torch.randn(2, 48), g)
    with pytest.raises(TypeError, match="Guidance"):
        ops.guided_fake_quantize(torch.randn(2, 32), "guidance")
    with pytest.raises(ValueError, match=r"\[E, N, K\]"):
        ops.refit_weights(torch.randn(8, 32), ops.allocate_refit_buffers(1, 8, 32, "cpu"))
    with pytest.raises(ValueError, match="out.scale"):
        bad = ops.allocate_refit_buffers(2, 8, 32, "cpu")
        ops.refit_weights(torch.randn(2, 8, 32), nvfp4.NVFP4Tensor(bad.codes, bad.block_scales, bad.scale[:1]))
    ops.raise_on_nonfinite()  # no GPU status word: nothing to raise


def test_nvtx_range_names():
    from trace_kernels import nvtx
    assert nvtx.range_name("quantize") == "trace_kernels/quantize"
    with nvtx.annotate("quantize"):
        pass


def test_counter_pool_grows_keeps_old_buffers_and_never_allocates_when_told_not_to(monkeypatch):
    """ops._common.counter_pool: the arrival counters of the MoE GEMM's fused epilogues (one buffer per device and
    pool; a CUDA-graph capture may not allocate one, moe_gemm asks with allocate=False there)."""
    from trace_kernels.ops import _common
    monkeypatch.setattr(_common, "_counters", {})
    monkeypatch.setattr(_common, "_retired_counters", [])
    cpu = torch.device("cpu")
    assert _common.counter_pool(cpu, 10, "a", allocate=False) is None and _common._counters == {}
    small = _common.counter_pool(cpu, 10, "a")
    assert small.dtype == torch.int32 and small.numel() >= 10 and not small.any()
    assert _common.counter_pool(cpu, small.numel(), "a", allocate=False) is small  # big enough: the same buffer
    assert _common.counter_pool(cpu, 10, "b") is not small  # pools are separate
    assert _common.counter_pool(cpu, small.numel() + 1, "a", allocate=False) is None
    big = _common.counter_pool(cpu, small.numel() + 1, "a")
    assert big.numel() > small.numel() and _common._retired_counters == [small]  # graphs may still use the old one


# ---------------------------------------------------------------------------------------------
# The bit-pattern selection of guided_fake_quantize v2 (cuda/include/trace_kernels/
# guided_fake_quantize.cuh: guided_compact_bits, guided_full_bits), ported line for line to int64
# tensor arithmetic (directed-rounding adds as exact integer arithmetic) and checked against the
# definition (docs/numerics.md) on every FP32 pattern within 64 ulps of each grid point and
# rounding midpoint, plus random values, zero and subnormals.
# ---------------------------------------------------------------------------------------------

GRID = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6], dtype=torch.float32)


def _bits(a: torch.Tensor) -> torch.Tensor:
    return a.view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _where(c, a, b):
    return torch.where(c, torch.as_tensor(a, dtype=torch.int64), torch.as_tensor(b, dtype=torch.int64))


def _as_float(bits):
    return bits.to(torch.int32).view(torch.float32)


def _device_compact_bits(ua, bit):
    """guided_compact_bits: (chosen FP32 bits, round-to-nearest differs). RD/RU(a + 1) for a < 1
    are exact integer arithmetic on a * 2^23 (exact in float64)."""
    a = _as_float(ua).double()
    small = a < 1
    lo = _where(small, _bits((1 + torch.floor(a * 2**23) / 2**23).float()), ua)
    hi = _where(small, _bits((1 + torch.ceil(a * 2**23) / 2**23).float()), ua)
    rounded = _where(((lo ^ (bit << 22)) & 0x400000) != 0, hi + 0x3FFFFF, lo) & 0xFFC00000
    nearest = (lo + 0x1FFFFF + (((lo >> 22) & 1) | (lo != hi).long())) & 0xFFC00000
    chosen = _bits((_as_float(rounded).double() - small.double()).float())  # minus the offset, exact
    return chosen, rounded != nearest


def _device_full_bits(ua, y_negative: bool, code: int):
    """guided_full_bits: (chosen FP32 bits, changed, chosen == rollout, nearest == rollout)."""
    a = _as_float(ua).double()
    small = a < 1
    offset = small.double()
    lo = _where(small, _bits((1 + torch.floor(a * 2**23) / 2**23).float()), ua)
    hi = _where(small, _bits((1 + torch.ceil(a * 2**23) / 2**23).float()), ua)
    rollout_bits = int(_bits(GRID[code & 7:(code & 7) + 1])[0])
    rollout_shifted = _bits((float(GRID[code & 7]) + offset).float())
    same_sign = bool(code & 8) == y_negative
    rounded = _where(torch.tensor(same_sign) & (rollout_shifted > (lo & 0xFFC00000)), hi + 0x3FFFFF, lo) & 0xFFC00000
    chosen = _bits((_as_float(rounded).double() - offset).float())
    nearest_shifted = (lo + 0x1FFFFF + (((lo >> 22) & 1) | (lo != hi).long())) & 0xFFC00000
    nearest = _bits((_as_float(nearest_shifted).double() - offset).float())
    guided_eq = (chosen == rollout_bits) & ((chosen == 0) | same_sign)
    nearest_eq = (nearest == rollout_bits) & ((nearest == 0) | same_sign)
    return chosen, rounded != nearest_shifted, guided_eq, nearest_eq


def _magnitudes() -> torch.Tensor:
    """min(|y|, 6) candidates: +-64 ulps around every grid point and midpoint, random, zero, tiny."""
    centres = torch.tensor([.25, .5, .75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6], dtype=torch.float32)
    near = (_bits(centres)[:, None] + torch.arange(-64, 65)[None, :]).flatten()
    rand = _bits(torch.rand(20000, generator=torch.Generator().manual_seed(0)) * 6)
    tiny = torch.tensor([0, 1, 2, 0x00800000, 0x1F000000], dtype=torch.int64)
    ua = torch.cat([near, rand, tiny]).unique()
    return ua[ua <= _bits(torch.tensor(6.0))]


def _definition(ua):
    """Floor index, on-grid flag and round-to-nearest index of a = float(ua) (docs/numerics.md)."""
    a = ua.to(torch.int32).view(torch.float32)
    lo = (a[:, None] >= GRID[None, 1:]).sum(1)
    on_grid = a == GRID[lo]
    nearest = (nvfp4.e2m1_round(a) & 7).long()
    return lo, on_grid, nearest


def test_guided_v2_compact_bits_match_the_definition():
    ua = _magnitudes()
    lo, on_grid, nearest = _definition(ua)
    for bit in (0, 1):
        want = torch.where(on_grid, lo, torch.where((lo & 1) == bit, lo, lo + 1))
        got, changed = _device_compact_bits(ua, torch.full_like(ua, bit))
        assert torch.equal(got, _bits(GRID[want])), f"compact, guidance bit {bit}"
        assert torch.equal(changed, want != nearest), f"changed-by-guidance count, guidance bit {bit}"


def test_guided_v2_full_choice_and_counters_match_the_definition():
    ua = _magnitudes()
    lo, on_grid, nearest = _definition(ua)
    for y_negative in (False, True):
        for code in range(16):
            rollout = -(code & 7) if code & 8 else code & 7  # signed index; code 8 (-0) is 0
            # definition: the signed neighbour nearer to the rollout's value (indices are monotone)
            lower = -(lo + 1) if y_negative else lo
            chosen_signed = torch.where(on_grid, -lo if y_negative else lo,
                                        torch.where(rollout <= lower, lower, lower + 1))
            chosen, changed, guided_eq, nearest_eq = _device_full_bits(ua, y_negative, code)
            assert torch.equal(chosen, _bits(GRID[chosen_signed.abs()])), f"full, code {code}, negative {y_negative}"
            assert torch.equal(changed, chosen_signed.abs() != nearest)
            assert torch.equal(guided_eq, chosen_signed == rollout)
            assert torch.equal(nearest_eq, (-nearest if y_negative else nearest) == rollout)


# ---------------------------------------------------------------------------------------------
# guided v3: the threshold construction (guided_block_v3) and the packed search in v3's select-tree form (its
# guided_pair_v3 kernel function is gone; the table search, guided_pair_tables, computes the same level masks
# k2, k1, k0), with guided_count_pair's counters on those masks (cuda/include/trace_kernels/guided_fake_quantize.cuh),
# ported to integers and checked on every BF16 bit pattern against trace_kernels.nvfp4 for a set of block steps d.
# ---------------------------------------------------------------------------------------------
from fractions import Fraction  # noqa: E402

import numpy as np  # noqa: E402

_EXP = 0x80  # x2 on a BF16 bit pattern


def _f32(v) -> np.float32:
    return np.float32(v)


def _directed32(q: Fraction, up: bool) -> np.float32:
    """RU / RD of an exact positive rational to FP32 (what __fmaf_ru / __fmaf_rd return)."""
    f = _f32(float(q))
    while Fraction(float(f)) > q:
        f = np.nextafter(f, _f32(0))
    while Fraction(float(np.nextafter(f, _f32(np.inf)))) <= q:
        f = np.nextafter(f, _f32(np.inf))
    return f if (not up or Fraction(float(f)) == q) else np.nextafter(f, _f32(np.inf))


def _ru16(f: np.float32) -> int:
    b = int(np.array(f, dtype=np.float32).view(np.uint32))
    return (b >> 16) + (1 if b & 0xFFFF else 0)


def _rn16(f: np.float32) -> int:
    return int(torch.tensor(float(f), dtype=torch.float32).to(torch.bfloat16).view(torch.int16)) & 0xFFFF


def _succ32(f: np.float32) -> np.float32:
    return np.array(int(np.array(f, dtype=np.float32).view(np.uint32)) + 1, dtype=np.uint32).view(np.float32)


def _v3_block_constants(d: np.float32):
    """guided_block_v3<__nv_bfloat16>: 16-bit A_j, B_j, outputs (with sign bits), midpoints."""
    dq = Fraction(float(d))
    a, b, out = [0] * 8, [0] * 7, [0] * 8
    a[2] = _ru16(_directed32(dq - dq / 2**25, up=True))
    a[3] = _ru16(_directed32(Fraction(3, 2) * dq - dq / 2**24, up=True))
    b[2] = _ru16(_succ32(_directed32(dq + dq / 2**24, up=False)))
    b[3] = _ru16(_succ32(_directed32(Fraction(3, 2) * dq + dq / 2**24, up=False)))
    b[0] = 0x0001
    out[2] = _rn16(d) | 0x8000
    out[3] = _rn16(_f32(1.5) * d) | 0x8000
    a[1], a[4], a[6], a[5], a[7] = a[2] - _EXP, a[2] + _EXP, a[2] + 2 * _EXP, a[3] + _EXP, a[3] + 2 * _EXP
    b[1], b[4], b[6], b[5] = b[2] - _EXP, b[2] + _EXP, b[2] + 2 * _EXP, b[3] + _EXP
    out[1], out[4], out[6], out[5], out[7] = (out[2] - _EXP, out[2] + _EXP, out[2] + 2 * _EXP, out[3] + _EXP,
                                              out[3] + 2 * _EXP)
    # e2m1_thresholds: ties up at .75, 1.75, 3.5 (RU(t - h) d); ties stay at .25, 1.25, 2.5, 5
    mids = []
    for t, h, up in [(Fraction(1, 4), 2**-26, False), (Fraction(3, 4), 2**-25, True), (Fraction(5, 4), 2**-24, False),
                     (Fraction(7, 4), 2**-24, True), (Fraction(5, 2), 2**-23, False), (Fraction(7, 2), 2**-23, True),
                     (Fraction(5), 2**-22, False)]:
        exact = t * dq - Fraction(h) * dq if up else t * dq + Fraction(h) * dq
        mids.append(_ru16(_directed32(exact, True) if up else _succ32(_directed32(exact, False))))
    return a, b, out, mids


def _bf16_value(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _v3_pair_lane(w: np.ndarray, g4, g2_of, g3_of, consts):
    """v3's search on one 16-bit lane (the select-tree form of guided_pair_tables' levels): w uint16 [N]; g*:
    guidance masks (callables of the search state for full guidance). Returns (output bits, k masks, n0)."""
    a_t, b_t, out_t, mids = consts
    a = _bf16_value(w & 0x7FFF)
    ge = lambda t: a >= _bf16_value(np.asarray(t, dtype=np.uint16))  # noqa: E731  HSET2: a >= t
    sel = np.where
    k2 = ge(sel(g4, b_t[3], a_t[4]))
    g2 = g2_of(k2)
    k1 = ge(sel(g2, sel(k2, b_t[5], b_t[1]), sel(k2, a_t[6], a_t[2])))
    g3 = g3_of(k2, k1)
    lower = sel(k2, sel(k1, b_t[6], b_t[4]), sel(k1, b_t[2], b_t[0]))
    upper = sel(k2, sel(k1, a_t[7], a_t[5]), sel(k1, a_t[3], a_t[1]))
    k0 = ge(sel(g3, lower, upper))
    value = sel(k2, sel(k1, sel(k0, out_t[7], out_t[6]), sel(k0, out_t[5], out_t[4])),
                sel(k1, sel(k0, out_t[3], out_t[2]), sel(k0, out_t[1], 0)))
    # guided_count_pair: nearest's parity as the XOR of its 7 comparisons, each the sign of RN16(|x| - mid_j)
    # (below_signs in quantize_epilogue.cuh: fma.rn.bf16x2 |x| * 1 + (-mid_j))
    below = [np.signbit(torch.from_numpy(a.astype(np.float64) - float(_bf16_value(np.uint16(m))))
                        .to(torch.bfloat16).float().numpy()) for m in mids]
    n0 = np.logical_xor.reduce([~b for b in below])
    out = value.astype(np.uint32) & (w.astype(np.uint32) | 0x7FFF)
    return out.astype(np.uint16), (k2, k1, k0), (g4, g2, g3), n0


# (e4m3 byte, row scale): normal and subnormal block scales, d at both ends of v3's exact range
_V3_STEPS = [(0x38, 1.0), (0x7E, 0.01234), (0x01, 0.37), (0x05, 3.1e-5), (0x30, 2.0**-40), (0x4C, 1.7e-3),
             (0x7E, 290.5), (0x38, 2.0**-100), (0x08, 2.0**-91), (0x7E, 292.57), (0x3B, 0.1), (0x57, 7.3e-8)]


def _guided_reference_bf16(x: torch.Tensor, b: int, s: float, bits=None, code=None):
    """Output bits, guided signed index and nearest signed index from trace_kernels.nvfp4."""
    rows = x.shape[0]
    block_scales = torch.full((rows, 1), b, dtype=torch.uint8).view(torch.float8_e4m3fn)
    scale = torch.full((rows,), s, dtype=torch.float32)
    if bits is not None:
        guidance = nvfp4.Guidance(scale, block_scales, torch.full((rows, 2), 0xFF * bits, dtype=torch.uint8), None)
    else:
        guidance = nvfp4.Guidance(scale, block_scales, None, torch.full((rows, 8), code | code << 4, dtype=torch.uint8))
    out = nvfp4.guided_fake_quantize(x, guidance).view(torch.int16).numpy().astype(np.uint16).reshape(-1)
    guided = nvfp4.unpack_codes(nvfp4.guided_quantize(x, guidance).codes).reshape(-1).numpy()
    d = (block_scales.to(torch.float32) * scale[:, None])
    nearest = nvfp4.e2m1_round(x.to(torch.float32) / d).reshape(-1).numpy()
    signed = lambda c: np.where(c & 8, -(c & 7).astype(np.int16), (c & 7).astype(np.int16))  # noqa: E731
    return out, signed(guided), signed(nearest)


def test_guided_v3_threshold_search_matches_the_reference_on_every_bf16():
    w = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    finite = (w & 0x7F80) != 0x7F80
    w = w[finite]
    x = torch.from_numpy(w.astype(np.int16)).view(torch.bfloat16).reshape(-1, 16)  # [N/16, 16]
    code_signed = lambda c: -(c & 7) if c & 8 else c & 7  # noqa: E731
    for b, s in _V3_STEPS:
        d = _f32(float(torch.tensor([b], dtype=torch.uint8).view(torch.float8_e4m3fn).float()) * _f32(s))
        assert 2.0**-100 <= d < 2.0**17, "v3's fast path covers this step"
        consts = _v3_block_constants(d)
        for bit in (0, 1):
            want_out, want_guided, want_nearest = _guided_reference_bf16(x, b, s, bits=bit)
            g = np.full(w.shape, bit == 1)
            out, _, (_, _, _), n0 = _v3_pair_lane(w, ~g, lambda k2: ~g, lambda k2, k1: g, consts)
            assert np.array_equal(out, want_out), f"compact output, d={d}, bit={bit}"
            k0 = _v3_pair_lane(w, ~g, lambda k2: ~g, lambda k2, k1: g, consts)[1][2]
            assert np.array_equal(n0 != k0, want_guided != want_nearest), f"changed, d={d}, bit={bit}"
        for code in range(16):
            want_out, want_guided, want_nearest = _guided_reference_bf16(x, b, s, code=code)
            byte = (code << 4) & 0xF0
            z = ((byte << 8) | byte) ^ (w & 0x8000)  # guided_block_v3's prmt for a low lane
            z_value = _bf16_value(z.astype(np.uint16))
            ge_j = lambda j: z_value >= _bf16_value(np.uint16(j << 12))  # noqa: E731
            j2_of = lambda k2: np.where(k2, 6, 2)  # noqa: E731
            out, (k2, k1, k0), (g4, g2, g3), n0 = _v3_pair_lane(
                w, ge_j(4), lambda k2: ge_j(j2_of(k2)), lambda k2, k1: ge_j(j2_of(k2) - 1 + 2 * k1), consts)
            assert np.array_equal(out, want_out), f"full output, d={d}, code={code}"
            changed = n0 != k0
            guided_eq = (z_value >= _bf16_value(np.uint16(0x8FFF))) & ~((k2 ^ g4) | (k1 ^ g2) | (k0 ^ g3))
            assert np.array_equal(changed, want_guided != want_nearest), f"changed, d={d}, code={code}"
            assert np.array_equal(guided_eq, want_guided == code_signed(code)), f"guided_eq, d={d}, code={code}"
            assert np.array_equal(guided_eq & ~changed, want_nearest == code_signed(code)), f"nearest_eq, d={d}"


# guided v6 / v7: guided_pair_tables and guided_tables_v6<__nv_bfloat16> (guided_fake_quantize.cuh) on 32-bit
# words of two BF16 lanes, with prmt.b32 emulated: each lane with its own guidance bit, checked against
# the reference on every finite BF16 pattern (in both lanes) for every step of _V3_STEPS.
def _prmt(a: np.ndarray, b: np.ndarray, sel: np.ndarray) -> np.ndarray:
    """prmt.b32 default mode, selector nibbles 0..7 only (bit 3, sign replication, is never set here)."""
    data = (np.asarray(b, dtype=np.uint64) << np.uint64(32)) | np.asarray(a, dtype=np.uint64)
    out = np.zeros(np.broadcast(a, b, sel).shape, dtype=np.uint64)
    for i in range(4):
        nibble = (sel.astype(np.uint64) >> np.uint64(4 * i)) & np.uint64(0xF)
        assert not (nibble & np.uint64(8)).any()
        out |= ((data >> (nibble * np.uint64(8))) & np.uint64(0xFF)) << np.uint64(8 * i)
    return out.astype(np.uint32)


def _ge_pairs(a: np.ndarray, t) -> np.ndarray:
    """HSET2.BF16_V2.GE as a mask: 0xFFFF in each lane where a >= t (both uint32 pairs of BF16)."""
    t = np.broadcast_to(np.asarray(t, dtype=np.uint32), a.shape)
    out = np.zeros(a.shape, dtype=np.uint32)
    for shift in (0, 16):
        lane = lambda v: _bf16_value(((v >> shift) & 0xFFFF).astype(np.uint16))  # noqa: E731
        out |= np.where(lane(a) >= lane(t), np.uint32(0xFFFF << shift), np.uint32(0))
    return out


def _table_pairs(w: np.ndarray, g4: np.ndarray, g2_of, g3_of, consts) -> np.ndarray:
    """guided_pair_tables<__nv_bfloat16> on words of two lanes; g*: the levels' guidance masks (g2_of(k2),
    g3_of(k2, k1) for full guidance, as in guided_pair_v3)."""
    a_t, b_t, out_t, _ = consts
    pair = lambda v: np.uint32(v * 0x10001)  # noqa: E731  v3's 16-bit pairs, both halves equal
    halves = lambda x, y: np.uint32((int(x) & 0xFFFF) | (int(y) & 0xFFFF0000))  # noqa: E731
    step2and4 = 0x00800080 + 0x00800000
    lower = (halves(pair(b_t[0]), pair(b_t[2])), pair(b_t[2]) + np.uint32(step2and4))
    upper = (halves(pair(a_t[1]), pair(a_t[3])), pair(a_t[3]) + np.uint32(step2and4))
    even = (pair(out_t[2]) & np.uint32(0xFFFF0000), pair(out_t[2]) + np.uint32(step2and4))
    odd = (halves(pair(out_t[1]), pair(out_t[3])), pair(out_t[3]) + np.uint32(step2and4))
    sel3 = lambda m, x, y: (m & x) | (~m & y)  # noqa: E731  select_bits
    a = w & np.uint32(0x7FFF7FFF)
    k2 = _ge_pairs(a, sel3(g4, pair(b_t[3]), pair(a_t[4])))
    g2 = g2_of(k2)
    k1 = _ge_pairs(a, sel3(g2, sel3(k2, pair(b_t[5]), pair(b_t[1])), sel3(k2, pair(a_t[6]), pair(a_t[2]))))
    q = (k2 & np.uint32(0x00440044)) | (k1 & np.uint32(0x00220022))
    sel = q | (q >> np.uint32(8)) | np.uint32(0x1010)
    k0 = _ge_pairs(a, sel3(g3_of(k2, k1), _prmt(*lower, sel), _prmt(*upper, sel)))
    value = sel3(k0, _prmt(*odd, sel), _prmt(*even, sel))
    return value & (w | np.uint32(0x7FFF7FFF))


def _v6_pairs(w: np.ndarray, guide: np.ndarray, consts) -> np.ndarray:
    """Compact guidance: guide all ones in a lane whose bit is 1."""
    return _table_pairs(w, ~guide, lambda k2: ~guide, lambda k2, k1: guide, consts)


def test_guided_v6_table_search_matches_the_reference_on_every_bf16():
    w = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    w = w[(w & 0x7F80) != 0x7F80]  # finite
    x = torch.from_numpy(w.astype(np.int16)).view(torch.bfloat16).reshape(-1, 16)
    partner = np.roll(np.arange(w.size), 12345)  # the high lane holds another pattern
    bits = np.random.default_rng(5).integers(0, 2, size=(2, w.size)).astype(np.uint32)
    words = w.astype(np.uint32) | (w[partner].astype(np.uint32) << 16)
    guide = bits[0] * np.uint32(0xFFFF) | bits[1] * np.uint32(0xFFFF0000)
    for b, s in _V3_STEPS:
        d = _f32(float(torch.tensor([b], dtype=torch.uint8).view(torch.float8_e4m3fn).float()) * _f32(s))
        want = [_guided_reference_bf16(x, b, s, bits=bit)[0] for bit in (0, 1)]  # [N] per guidance bit
        got = _v6_pairs(words, guide, _v3_block_constants(d))
        assert np.array_equal(got & 0xFFFF, np.where(bits[0] == 1, want[1], want[0])), f"low lane, d={d}"
        high = np.where(bits[1] == 1, want[1][partner], want[0][partner])
        assert np.array_equal(got >> 16, high), f"high lane, d={d}"


def test_guided_v7_full_guidance_table_search_matches_the_reference_on_every_bf16():
    """guided_pair_tables with full guidance (v7): each lane with its own rollout code, every finite BF16
    pattern in both lanes, every step of _V3_STEPS."""
    w = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    w = w[(w & 0x7F80) != 0x7F80]
    x = torch.from_numpy(w.astype(np.int16)).view(torch.bfloat16).reshape(-1, 16)
    partner = np.roll(np.arange(w.size), 12345)
    codes = np.random.default_rng(6).integers(0, 16, size=(2, w.size)).astype(np.uint32)
    words = w.astype(np.uint32) | (w[partner].astype(np.uint32) << 16)
    # guided_block_v3's prmt: the code at bits 12..15 of each lane, xor x's sign
    z = (codes[0] << 12 | codes[1] << 28) ^ (words & np.uint32(0x80008000))
    ge_j = lambda j: _ge_pairs(z, np.uint32((j << 12) * 0x10001))  # noqa: E731
    j2_of = lambda k2: (k2 & np.uint32(0x60006000)) | (~k2 & np.uint32(0x20002000))  # noqa: E731
    g2_of = lambda k2: _ge_pairs(z, j2_of(k2))  # noqa: E731
    g3_of = lambda k2, k1: _ge_pairs(z, j2_of(k2) - np.uint32(0x10001000) + (k1 & np.uint32(0x20002000)))  # noqa: E731
    for b, s in _V3_STEPS:
        d = _f32(float(torch.tensor([b], dtype=torch.uint8).view(torch.float8_e4m3fn).float()) * _f32(s))
        got = _table_pairs(words, ge_j(4), g2_of, g3_of, _v3_block_constants(d))
        want = np.stack([_guided_reference_bf16(x, b, s, code=c)[0] for c in range(16)])  # [code, N]
        assert np.array_equal(got & 0xFFFF, want[codes[0], np.arange(w.size)]), f"low lane, d={d}"
        assert np.array_equal(got >> 16, want[codes[1], partner]), f"high lane, d={d}"


def test_guided_v3_bf16_midpoints_are_moved_by_the_exponent():
    """guided_block_v3<__nv_bfloat16> forms the round-to-nearest thresholds at 2.5, 5 and 3.5 from those at
    1.25 and 1.75 by exponent steps: exact over v3's range of d."""
    for b, s in _V3_STEPS:
        d = _f32(float(torch.tensor([b], dtype=torch.uint8).view(torch.float8_e4m3fn).float()) * _f32(s))
        mids = _v3_block_constants(d)[3]
        assert (mids[4], mids[6], mids[5]) == (mids[2] + _EXP, mids[2] + 2 * _EXP, mids[3] + _EXP), f"d={d}"


# quantize_block16_fast (quantize_epilogue.cuh) ported: for BF16, thresholds of t = .25, .75, 1.25,
# 1.75 built as e2m1_thresholds builds them, those of 2.5, 3.5, 5 by exponent steps, d == 0 as
# d = 2^100; a 3-level search per lane; checked against nvfp4.e2m1_round(x / d) on every finite BF16.
def _fast_thresholds_bf16(d: np.float32) -> list[int]:
    dq = Fraction(float(d))
    b0 = _ru16(_succ32(_directed32(dq / 4 + dq / 2**26, up=False)))
    b1 = _ru16(_directed32(Fraction(3, 4) * dq - dq / 2**25, up=True))
    b2 = _ru16(_succ32(_directed32(Fraction(5, 4) * dq + dq / 2**24, up=False)))
    b3 = _ru16(_directed32(Fraction(7, 4) * dq - dq / 2**24, up=True))
    return [b0, b1, b2, b3, b2 + _EXP, b3 + _EXP, b2 + 2 * _EXP]


def _fast_codes_bf16(w: np.ndarray, thresholds: list[int]) -> np.ndarray:
    a = _bf16_value(w & 0x7FFF)
    ge = lambda t: a >= _bf16_value(np.asarray(t, dtype=np.uint16))  # noqa: E731  HSET2: a >= t
    b = thresholds
    k2 = ge(b[3])
    k1 = ge(np.where(k2, b[5], b[1]))
    k0 = ge(np.where(k2, np.where(k1, b[6], b[4]), np.where(k1, b[2], b[0])))
    nonzero = ge(b[0])
    m = 4 * k2.astype(np.uint8) + 2 * k1.astype(np.uint8) + k0.astype(np.uint8)
    return m | ((w >> 15).astype(np.uint8) & nonzero.astype(np.uint8)) << 3


# (e4m3 byte, row scale s): s across row_scale_fast's [2^-40, 2^37], normal and subnormal block
# scales, and byte 0 (d == 0: every code +0)
_FAST_STEPS = [(0x38, 1.0), (0x7E, 2.0**37), (0x01, 2.0**-40), (0x05, 3.1e-5), (0x30, 0.37), (0x4C, 1.7e-3),
               (0x7E, 290.5), (0x08, 7.3e-8), (0x3B, 0.1), (0x57, 2.0**20), (0x00, 0.5)]


def test_quantize_fast_block_thresholds_match_the_reference_on_every_bf16():
    w = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    w = w[(w & 0x7F80) != 0x7F80]  # finite
    x = torch.from_numpy(w.astype(np.int16)).view(torch.bfloat16).float()
    for byte, s in _FAST_STEPS:
        scale = float(torch.tensor([byte], dtype=torch.uint8).view(torch.float8_e4m3fn).float())
        d = _f32(scale) * _f32(s)
        want = nvfp4.e2m1_round(x / float(d)).numpy() if d != 0 else np.zeros(w.shape, dtype=np.uint8)
        if d != 0:
            assert 2.0**-49 <= d <= 2.0**46, "the fast path's range of nonzero steps"
            big = np.abs(x.numpy()) <= 2688 * s  # |x| a row with this scale can hold
            got = _fast_codes_bf16(w, _fast_thresholds_bf16(d))
            assert np.array_equal(got[big], want[big]), f"codes, byte={byte:#x}, s={s}"
        else:
            got = _fast_codes_bf16(w, _fast_thresholds_bf16(_f32(2.0**100)))
            assert not got[np.abs(x.numpy()) <= 2688 * s].any(), "d == 0: every code +0"


def _rn32(q: Fraction) -> np.float32:
    """Round an exact rational to the nearest FP32, ties to even (an FMA's single rounding)."""
    sign = -1 if q < 0 else 1
    q = abs(q)
    if q == 0:
        return _f32(0.0)
    lo, hi = _directed32(q, up=False), _directed32(q, up=True)
    if lo == hi:
        return _f32(sign * float(lo))
    d_lo, d_hi = q - Fraction(float(lo)), Fraction(float(hi)) - q
    even_lo = int(np.array(lo, dtype=np.float32).view(np.uint32)) % 2 == 0
    pick = lo if d_lo < d_hi or (d_lo == d_hi and even_lo) else hi
    return _f32(sign * float(pick))


def test_block_step_markstein_division_is_exact_in_the_fast_range():
    """block_step_fast divides by 6 s with nvfp4::div_rn_fast (r = RN(1/d), two corrections): equal
    to the correctly rounded quotient for 6 s over row_scale_fast's range and block amaxes up to the
    row amax (below 2^-80 the step is 0 either way)."""
    rng = np.random.default_rng(3)
    for _ in range(400):
        s = _f32(2.0 ** rng.uniform(-40, 37))
        six_s = _f32(_f32(6.0) * s)
        amax = _f32(2688.0) * s
        x = _f32(amax * _f32(2.0 ** -rng.uniform(0, 60)))
        if x < 2.0**-80:
            continue
        d, xq = Fraction(float(six_s)), Fraction(float(x))
        r = _rn32(1 / d)
        q0 = _rn32(xq * Fraction(float(r)))
        q1 = _rn32(_rn32(xq - d * Fraction(float(q0))) * Fraction(float(r)) + Fraction(float(q0)))
        q2 = _rn32(_rn32(xq - d * Fraction(float(q1))) * Fraction(float(r)) + Fraction(float(q1)))
        assert q2 == _rn32(xq / d), (float(x), float(six_s))


def test_status_op_bits_are_distinct_and_named():
    """Every status-word op bit is declared once, in status.cuh's StatusOp, and named in STATUS_OPS
    (kv_append and the fused MoE epilogue once shared bit 8, so one was reported as the other)."""
    import re
    from trace_kernels import paths
    from trace_kernels.ops._common import STATUS_OPS
    include = paths.include_dir() / "trace_kernels"
    enum = re.search(r"enum StatusOp : uint32_t \{(.*?)\};", (include / "status.cuh").read_text(), re.S).group(1)
    bits = {name: int(value) for name, value in re.findall(r"(kStatus\w+) = (\d+)u", enum)}
    assert sorted(bits.values()) == sorted(STATUS_OPS) and len(set(bits.values())) == len(bits)
    assert all(b & (b - 1) == 0 for b in bits.values())
    for header in include.glob("*.cuh"):  # no kernel declares its own bit
        assert not re.search(r"constexpr\s+\w+\s+kStatus\w+\s*=", header.read_text()), header.name
