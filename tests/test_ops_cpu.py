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


def test_refit_plan_keeps_every_cta_resident(monkeypatch):
    """The cooperative grid never exceeds what fits; groups follow tiles, experts and the L2."""
    import importlib
    import types
    refit = importlib.import_module("trace_kernels.ops.refit_weights")
    monkeypatch.setattr(refit.driver, "multiprocessor_count", lambda device: 132)
    monkeypatch.setattr(refit.torch.cuda, "get_device_properties",
                        lambda device: types.SimpleNamespace(L2_cache_size=60 << 20))
    kernel = types.SimpleNamespace(max_active_blocks_per_sm=lambda device, threads: 3)  # 396 resident
    tile = 16384
    grid, per_group = refit.plan(0, kernel, tile, experts=128, per_expert=1536 * 2048, elem_bytes=2)
    assert grid <= 396 and grid % per_group == 0 and per_group >= 192  # one tile per CTA: 192 tiles
    grid, per_group = refit.plan(0, kernel, tile, experts=1, per_expert=64 * 64, elem_bytes=2)
    assert (grid, per_group) == (396, 396)  # a single expert: one group of every resident CTA
    grid, per_group = refit.plan(0, kernel, tile, experts=64, per_expert=16 * 16, elem_bytes=2)
    assert grid // per_group == 64 and grid <= 396  # tiny experts: one group each
    grid, per_group = refit.plan(0, kernel, tile, experts=8, per_expert=4096 * 8192, elem_bytes=2)
    assert (grid, per_group) == (396, 396)  # an expert larger than half the L2: one at a time
    # v3: every resident CTA, chunks of ~L2/5 (at least one expert, at most all of them)
    assert refit.plan_v3(0, kernel, experts=128, per_expert=1536 * 2048, elem_bytes=2) == (396, 2)
    assert refit.plan_v3(0, kernel, experts=8, per_expert=4096 * 8192, elem_bytes=2) == (396, 1)
    assert refit.plan_v3(0, kernel, experts=3, per_expert=64 * 64, elem_bytes=2) == (396, 3)


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
