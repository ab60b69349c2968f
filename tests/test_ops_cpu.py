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
