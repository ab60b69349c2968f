"""GPU tests of ops.refit_weights_packed_ (sm_90a, marked gpu), every variant: bit for bit refit_weights followed by
the torch path of moe_layout.store_fragments_, on fresh random weights with the hard cases built in; destination
poisoned first, addresses kept; syncs after a small step (the speculative variant's guesses right and wrong);
non-finite experts flagged (left unchanged, or NaN block scales for the speculative variant); the MoE GEMM reads the
result."""

import pytest
import torch

from trace_kernels import moe_encoding, moe_layout, ops
from trace_kernels.codegen.ops import refit_packed as codegen_packed
from trace_kernels.runtime import capture_graph

pytestmark = pytest.mark.gpu

# (E, N, K, groups): the tiny preset's gate_up / down, small odd tilings, Qwen3-30B-A3B's gate_up / down
SHAPES = [(8, 256, 256, 2), (8, 256, 128, 1), (3, 64, 64, 1), (5, 192, 320, 2),
          (128, 1536, 2048, 2), (128, 2048, 768, 1)]
BIG = 128 * 1536 * 2048


@pytest.fixture(autouse=True, params=codegen_packed.VARIANTS)
def packed_variant(request, monkeypatch):
    monkeypatch.setattr(codegen_packed, "VARIANT", request.param)
    return request.param


@pytest.fixture(autouse=True)
def _clean_status():
    ops.raise_on_nonfinite()  # a flag left by an earlier test would be blamed on this one
    yield
    ops.raise_on_nonfinite()  # no test may leave a raised flag behind


def hard_weights(e, n, k, dtype, seed):
    """Fresh random [E, N, K] (never zeros) with: a zero row, an all-zero expert, blocks 1e-5 .. 1e-7 below
    their expert's amax (subnormal or zero E4M3 scales), huge outliers, an expert outside the fast scale
    range (row_scale_fast: s < 2^-40 or, where the dtype holds it, s > 2^37), per-block magnitudes spread."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(e, n, k, device="cuda", generator=gen)
    w *= 10 ** torch.empty(e, n, k // 16, 1, device="cuda").uniform_(-2, 0, generator=gen).repeat_interleave(16, 2)[..., 0]
    w *= 10 ** torch.empty(e, 1, 1, device="cuda").uniform_(-2, 2, generator=gen)
    w[0, 1] = 0
    w[0, 2, : k // 2] *= 1e-5
    w[0, 3] *= 1e-7
    if e > 1:
        w[1] = 0
    if e > 2:
        w[2, 0, 5] = 3e4 if dtype == torch.float16 else 1e6  # one outlier: most blocks of expert 2 tiny
        w[2, n - 1, k - 1] = -w[2, 0, 5]
    if e > 3:
        w[3] *= 1e-12 if dtype != torch.float16 else 1e-4  # fp16: small (subnormal inputs), fast path
    if e > 4 and dtype != torch.float16:
        w[4] *= 1e30  # s ~ 2^88: the exact (non-fast) block path
    return w.to(dtype)


def reference(w, groups):
    """refit_weights (its GPU kernel, bit-exact with nvfp4.quantize) + store_fragments_' torch path."""
    e, n, k = w.shape
    staging = ops.refit_weights(w, ops.allocate_refit_buffers(e, n, k, w.device))
    return moe_layout.store_fragments_(moe_layout.empty_weights(e, n, k, w.device), staging.codes,
                                       staging.block_scales, staging.scale, groups, kernel=False)


def poisoned(e, n, k):
    dst = moe_layout.empty_weights(e, n, k, "cuda")
    dst.codes.fill_(0xAB)
    dst.block_scales.fill_(0xAB)
    dst.scale.fill_(float("nan"))
    return dst


def assert_same(got, want, what):
    assert torch.equal(got.codes, want.codes), f"{what}: codes differ at {(got.codes != want.codes).nonzero()[:4].tolist()}"
    assert torch.equal(got.block_scales, want.block_scales), f"{what}: block scales differ"
    assert torch.equal(got.scale.view(torch.int32), want.scale.view(torch.int32)), f"{what}: scales differ"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("e,n,k,groups", SHAPES)
def test_bitexact_vs_refit_then_store_fragments(e, n, k, groups, dtype):
    if e * n * k >= BIG and dtype != torch.bfloat16:
        e = 16  # the full 128 experts once (bf16, the engine's dtype); other dtypes on 16 of them
    w = hard_weights(e, n, k, dtype, seed=e + n + k + groups)
    want = reference(w, groups)
    got = poisoned(e, n, k)
    ptrs = [t.data_ptr() for t in (got.codes, got.block_scales, got.scale)]
    assert ops.refit_weights_packed_(w, got, groups=groups) is got
    torch.cuda.synchronize()
    assert ptrs == [t.data_ptr() for t in (got.codes, got.block_scales, got.scale)]
    assert_same(got, want, f"{dtype} [{e}, {n}, {k}] groups={groups}")
    if e * n * k <= 8 * 256 * 256:  # small shapes also against the pure reference (nvfp4.quantize on the CPU)
        cpu = moe_layout.empty_weights(e, n, k)
        ops.refit_weights_packed_(w.cpu(), cpu, groups=groups)
        assert_same(got.to("cpu"), cpu, "vs the CPU reference")
    assert float(got.scale[1]) == 0.0 and not got.codes[1].any()  # the all-zero expert


def test_refit_twice_and_graph_replay_keep_addresses():
    """A second refit overwrites every byte; a captured graph replays onto the same buffers."""
    e, n, k = 8, 256, 256
    w1, w2 = hard_weights(e, n, k, torch.bfloat16, 1), hard_weights(e, n, k, torch.bfloat16, 2)
    dst = poisoned(e, n, k)
    ops.refit_weights_packed_(w1, dst, groups=2)
    ops.refit_weights_packed_(w2, dst, groups=2)
    assert_same(dst, reference(w2, 2), "second refit")
    src = w1.clone()
    ops.refit_weights_packed_(src, dst, groups=2)  # warm-up outside the capture (JIT, workspace pool)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with capture_graph(graph):
        ops.refit_weights_packed_(src, dst, groups=2)
    src.copy_(w2)
    graph.replay()
    torch.cuda.synchronize()
    assert_same(dst, reference(w2, 2), "graph replay")


@pytest.mark.parametrize("groups", [1, 2])
def test_nonfinite_expert_is_flagged(groups, packed_variant):
    e, n, k = 4, 128, 128
    w = hard_weights(e, n, k, torch.bfloat16, 7)
    dst = poisoned(e, n, k)
    ops.refit_weights_packed_(w, dst, groups=groups)
    before = [t.clone() for t in (dst.codes, dst.block_scales, dst.scale)]
    w2 = hard_weights(e, n, k, torch.bfloat16, 8)
    w2[2, 70, 9] = float("nan")
    w2[2, 100, 64] = float("inf")
    ops.refit_weights_packed_(w2, dst, groups=groups)
    with pytest.raises(ValueError, match=r"refit_weights .* 2 non-finite .* row 326, column 9"):  # 2 * 128 + 70
        ops.raise_on_nonfinite()
    want = reference(torch.where(torch.isfinite(w2), w2, 0), groups)
    for i, (got, old, new) in enumerate(zip((dst.codes, dst.block_scales, dst.scale), before,
                                            (want.codes, want.block_scales, want.scale))):
        if packed_variant == "v1" or i == 2:  # v2 keeps the bad expert's scale, not its codes
            assert torch.equal(got[2], old[2]), f"tensor {i}: the bad expert must keep its previous bytes"
        for x in (0, 1, 3):
            assert torch.equal(got[x], new[x]), f"tensor {i}: expert {x}"
    if packed_variant == "v2":  # its first pass may have packed part of the bad expert: every block scale NaN
        assert bool(torch.isnan(moe_encoding.decode_scales(dst.block_scales[2]).float()).all())
    with pytest.raises(ValueError, match="non-finite"):  # the CPU path raises like nvfp4.quantize
        ops.refit_weights_packed_(w2.cpu(), moe_layout.empty_weights(e, n, k), groups=groups)


@pytest.mark.parametrize("groups", [1, 2])
def test_sync_after_a_small_step(groups):
    """A second sync into the same buffers after an RL-like step (v2 takes the scales they hold as its guess): experts
    whose amax did not move, grew, shrank, an all-zero one, and one off the fast block path's range; then the same
    weights again into buffers whose codes and block scales were poisoned (every guess holds: the first pass must
    write every record)."""
    e, n, k = 6, 192, 256
    w = hard_weights(e, n, k, torch.bfloat16, 21)  # experts 3 and 4 off the fast range (s < 2^-40, s ~ 2^88)
    dst = poisoned(e, n, k)
    ops.refit_weights_packed_(w, dst, groups=groups)
    assert_same(dst, reference(w, groups), "first sync")
    g = torch.Generator(device="cuda").manual_seed(22)
    amax = w.float().abs().amax(dim=(1, 2), keepdim=True)  # [E, 1, 1]
    step = (w.float() * (1 + 1e-2 * torch.randn(w.shape, device="cuda", generator=g))).clamp(-amax, amax)
    step = step.to(torch.bfloat16)
    flat, arg = step.view(e, -1), w.float().abs().view(e, -1).argmax(dim=1)
    flat[torch.arange(e), arg] = w.view(e, -1)[torch.arange(e), arg]  # keep each maximum
    step[2, 5, 7] = (amax[2, 0, 0] * 1.5).to(torch.bfloat16)  # grew
    step[3] *= 0.5  # shrank (off the fast range)
    step[1].zero_()  # was all zero already
    step[4] *= 2.0  # grew (off the fast range)
    ops.refit_weights_packed_(step, dst, groups=groups)
    assert_same(dst, reference(step, groups), "after a step")
    dst.codes.fill_(0xAB)
    dst.block_scales.fill_(0xAB)
    ops.refit_weights_packed_(step, dst, groups=groups)
    assert_same(dst, reference(step, groups), "same weights, poisoned codes")


def test_moe_gemm_reads_refit_packed_weights_like_torch_packed():
    """Bit-identical buffers give identical MoE outputs (the engine's path: fused gate_up, routed down)."""
    from trace_kernels import moe_gemm, moe_gemm_ref
    from trace_kernels.moe_routing import route
    from trace_kernels.moe_testing import random_topk, random_weights
    e, h, i, top_k, tokens = 8, 64, 64, 2, 4  # a shape profiling/prebuild_engine_kernels.py builds
    gate_up_w = random_weights(e, 2 * i, h, 11, "cuda").to(torch.bfloat16)  # [E, 2I, H]: gate rows, then up rows
    down_w = random_weights(e, h, i, 12, "cuda").to(torch.bfloat16)
    packed = [ops.refit_weights_packed_(gate_up_w, poisoned(e, 2 * i, h), groups=2),
              ops.refit_weights_packed_(down_w, poisoned(e, h, i), groups=1)]
    torch_packed = [reference(gate_up_w, 2), reference(down_w, 1)]
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(tokens, h, generator=gen).to("cuda", torch.bfloat16)
    ids = random_topk(tokens, e, top_k, gen).to("cuda")
    routing = route(ids, e, torch.softmax(torch.randn(tokens, top_k, generator=gen), dim=1).to("cuda"))
    a, s_a = moe_gemm_ref.quantize_activations(x)
    outs = []
    for gu, dn in (packed, torch_packed):
        up = moe_gemm.moe_gate_up(a, gu, routing.offsets, row_index=routing.row_index, row_scale=s_a)
        outs.append((up.h, moe_gemm.moe_down(up.a_next, dn, routing, row_scale=up.q.scale)))
    torch.cuda.synchronize()
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert torch.isfinite(outs[0][1].float()).all()


def test_bad_device_inputs_raise_before_launch():
    e, n, k = 2, 64, 64
    w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16)
    dst = moe_layout.empty_weights(e, n, k, "cuda")
    with pytest.raises(ValueError, match="contiguous"):
        ops.refit_weights_packed_(torch.randn(e, k, n, device="cuda").transpose(1, 2), dst)
    misaligned = torch.empty(w.numel() + 1, dtype=w.dtype, device="cuda")[1:].view_as(w)
    with pytest.raises(ValueError, match="16-byte aligned"):
        ops.refit_weights_packed_(misaligned, dst)
    with pytest.raises(ValueError, match="is on cpu"):
        ops.refit_weights_packed_(w, moe_layout.empty_weights(e, n, k))
    with pytest.raises(TypeError, match="dtype"):
        ops.refit_weights_packed_(w.double(), dst)
    codes = torch.empty(dst.codes.numel() + 1, dtype=torch.uint8, device="cuda")[1:].view_as(dst.codes)
    with pytest.raises(ValueError, match="dst.codes must start at a 16-byte aligned"):
        ops.refit_weights_packed_(w, moe_layout.MoEWeights(codes, dst.block_scales, dst.scale))
