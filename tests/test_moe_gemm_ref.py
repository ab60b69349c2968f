"""CPU tests of the NVFP4 MoE GEMM reference, the weight layout, routing and input validation."""

import itertools
import re

import pytest
import torch

from trace_kernels import moe_encoding as Enc
from trace_kernels import moe_gemm_ref as G
from trace_kernels import moe_layout as L
from trace_kernels import moe_routing as R
from trace_kernels import nvfp4, paths
from trace_kernels.moe_testing import make_problem

E, H, I, K_TOP, T = 4, 128, 64, 2, 9


@pytest.fixture(scope="module")
def problem():
    return make_problem(E, H, I, K_TOP, T, seed=1)


def _dequant64(w: L.MoEWeights) -> torch.Tensor:
    return L.dequantize_weights(w).to(torch.float64)  # [E, N, K]


# ---------------------------------------------------------------------------------------------
# layout
# ---------------------------------------------------------------------------------------------

def test_pack_unpack_roundtrip():
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 256, (2, 128, 64), dtype=torch.uint8, generator=gen)  # [E, N, K/2]
    scales = torch.randint(1, 127, (2, 128, 8), dtype=torch.uint8, generator=gen).view(torch.float8_e4m3fn)
    w = L.pack_weights(codes, scales, torch.rand(2))
    assert w.block_scales.dtype == torch.uint8
    c, s, _ = L.unpack_weights(w)
    assert torch.equal(c, codes) and torch.equal(s.view(torch.uint8), scales.view(torch.uint8))


def test_zero_scale_blocks_pack_zero_codes_and_bad_scales_raise():
    gen = torch.Generator().manual_seed(3)
    codes = torch.randint(1, 256, (1, 64, 32), dtype=torch.uint8, generator=gen)  # never all-zero bytes
    scales = torch.randint(1, 127, (1, 64, 4), dtype=torch.uint8, generator=gen)
    scales[0, 5, 2] = 0x00
    scales[0, 9, 0] = 0x80  # -0
    c, s, _ = L.unpack_weights(L.pack_weights(codes, scales.view(torch.float8_e4m3fn), torch.ones(1)))
    assert torch.equal(c[0, 5, 16:24], torch.zeros(8, dtype=torch.uint8)) and c[0, 9, :8].eq(0).all()
    keep = torch.ones_like(c, dtype=torch.bool)
    keep[0, 5, 16:24] = False
    keep[0, 9, :8] = False
    assert torch.equal(c[keep], codes[keep]) and int(s.view(torch.uint8)[0, 9, 0]) == 0
    for bad in (0xB8, 0x7F):  # -1.0, NaN
        scales[0, 1, 1] = bad
        with pytest.raises(ValueError, match="non-negative and finite"):
            L.pack_weights(codes, scales.view(torch.float8_e4m3fn), torch.ones(1))


def test_store_fragments_rejects_unknown_row_groups():
    codes, scales = torch.zeros(1, 64, 32, dtype=torch.uint8), torch.zeros(1, 64, 4, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="groups must be 1 or 2"):
        L.store_fragments_(L.empty_weights(1, 64, 64), codes, scales, torch.ones(1), groups=3)


def test_unencoded_or_mistyped_weights_raise():
    """Packed weights from before the scale encoding (float8 block scales) and non-byte natural codes are
    refused with a clear error, not misread."""
    w = L.quantize_weights(torch.randn(1, 64, 64))
    old = L.MoEWeights(w.codes, w.block_scales.view(torch.float8_e4m3fn), w.scale)
    with pytest.raises(TypeError, match="uint8 \\(encoded scales"):
        old.validate()
    codes, scales, scale = L.unpack_weights(w)
    with pytest.raises(TypeError, match="uint8 codes"):
        L.pack_weights_(L.empty_weights(1, 64, 64), codes.to(torch.int32), scales, scale)


def test_pack_in_place_keeps_addresses():
    w = torch.randn(2, 128, 128)
    packed = L.quantize_weights(w)
    dst = L.empty_weights(2, 128, 128)
    ptrs = (dst.codes.data_ptr(), dst.block_scales.data_ptr(), dst.scale.data_ptr())
    L.pack_weights_(dst, *L.unpack_weights(packed))
    assert ptrs == (dst.codes.data_ptr(), dst.block_scales.data_ptr(), dst.scale.data_ptr())
    assert torch.equal(dst.codes, packed.codes) and torch.equal(dst.scale, packed.scale)
    assert torch.equal(dst.block_scales, packed.block_scales)


def test_packed_words_decode_to_the_wgmma_fragments():
    """Thread i = 32w + 4g + q, k16 step j: the decoded word j = bytes a0..a3 (rows r, r+8; k, k+8)."""
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 256, (1, 128, 64), dtype=torch.uint8, generator=gen)
    scales = torch.randint(1, 120, (1, 128, 8), dtype=torch.uint8, generator=gen)
    w = L.pack_weights(codes, scales.view(torch.float8_e4m3fn), torch.ones(1))
    words = Enc.decode_code_words(w.codes.reshape(1, 2, 2, 512, 4))  # [E, t, c, thread * 4 + j, byte]
    packed_scales = Enc.decode_scales(w.block_scales).view(torch.uint8)
    for t, c, w_, g, q, j in [(0, 0, 0, 0, 0, 0), (1, 1, 3, 7, 3, 3), (0, 1, 2, 5, 1, 2), (1, 0, 1, 3, 2, 1)]:
        thread = 32 * w_ + 4 * g + q
        r = 64 * t + 16 * w_ + g
        k = 64 * c + 16 * j + 2 * q
        got = words[0, t, c, 4 * thread + j].tolist()
        want = [codes[0, r, k // 2], codes[0, r + 8, k // 2], codes[0, r, (k + 8) // 2], codes[0, r + 8, (k + 8) // 2]]
        assert got == [int(v) for v in want]
        sc = packed_scales[0, t, c, 64 * w_ + 8 * g + 2 * j: 64 * w_ + 8 * g + 2 * j + 2].tolist()
        assert sc == [int(scales[0, r, 4 * c + j]), int(scales[0, r + 8, 4 * c + j])]


def _kernel_registers(q: torch.Tensor) -> torch.Tensor:
    """moe_dequant.cuh's shifts + LOP3 on int64 words [...] -> registers [..., 4] (vectorized)."""
    return torch.stack(Enc.kernel_registers(q), dim=-1)


def _bf16_halves(bits: torch.Tensor) -> torch.Tensor:
    """int64 BF16x2 bit patterns [...] -> float32 [..., 2] (low half first)."""
    halves = torch.stack((bits & 0xFFFF, bits >> 16), dim=-1)
    return (halves.to(torch.int32) << 16).view(torch.float32)


def test_kernel_dequant_arithmetic_is_exact():
    """Every code x every E4M3 scale: the BF16 the kernel's bit operations form, times the scale BF16 it
    forms, is value(code) * scale * 2^-7 exactly, and that product is a BF16 (so HMUL2 is exact)."""
    nibbles = torch.arange(16, dtype=torch.int64)
    pairs = (nibbles.view(16, 1) | (nibbles.view(1, 16) << 4)).flatten()  # all 256 code bytes
    words = torch.stack([pairs, pairs.roll(1), pairs.roll(7), pairs.roll(100)], dim=-1).to(torch.uint8)  # [256, 4]
    q = Enc.encode_code_words(words).view(torch.int32).to(torch.int64).squeeze(-1) & 0xFFFFFFFF  # [256]
    values = _bf16_halves(_kernel_registers(q))  # [256, 4 registers, 2 halves]
    want = nvfp4._code_values(torch.stack([words & 15, words >> 4], dim=-1))  # [256, 4, 2]
    assert torch.equal(values * 2.0**126, want)  # value * 2^-126: +-0.5 is the BF16 subnormal 2^-127
    scales = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn)  # every non-negative E4M3
    s_kernel = Enc.kernel_scale_bf16(Enc.encode_scales(scales))  # [127]
    nonzero = scales.to(torch.float32) > 0
    assert torch.equal(s_kernel[nonzero], scales.to(torch.float32)[nonzero] * 2.0**119)
    product = values.reshape(-1, 1) * s_kernel.view(1, -1)  # float32: exact (<= 6 significant bits)
    exact = want.reshape(-1, 1) * scales.to(torch.float32).view(1, -1) / Enc.WEIGHT_SCALE_FOLD
    assert torch.equal(product[:, nonzero], exact[:, nonzero])
    assert torch.equal(product.to(torch.bfloat16).to(torch.float32), product)
    assert torch.equal(Enc.decode_scales(Enc.encode_scales(scales)).view(torch.uint8), scales.view(torch.uint8))


def test_no_four_rotations_of_the_field_mask_tile_a_word():
    """Why registers XOR two shifted words (moe_encoding): a plain rotate + mask per register would
    need four rotations of FIELD_MASK's bits that cover all 32 bits, and none exist."""
    bits = [b for b in range(32) if Enc.FIELD_MASK >> b & 1]
    rotated = [frozenset((b + s) % 32 for b in bits) for s in range(32)]
    for combo in itertools.combinations(range(32), 4):
        assert len(frozenset().union(*(rotated[s] for s in combo))) < 32


def test_register_terms_are_an_invertible_map_with_two_rotations():
    """The encoding is a bijection (decode(encode(w)) == w for random words), and of its four distinct
    shifts only two are rotations (the ALU-only funnel shifts)."""
    words = torch.randint(0, 256, (4096, 4), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    assert torch.equal(Enc.decode_code_words(Enc.encode_code_words(words)), words)
    shifts = {term for terms in Enc.REGISTER_TERMS for term in terms if term[0] != "id"}
    assert len(shifts) == 4 and sum(term[0] == "rotl" for term in shifts) == 2


def test_device_dequant_constants_match_the_encoding():
    header = (paths.include_dir() / "trace_kernels" / "moe_dequant.cuh").read_text()
    consts = dict(re.findall(r"(k(?:Rot|Shl)\w+) = (\d+)", header))
    assert {k: int(v) for k, v in consts.items()} == {"kRotA1": 12, "kRotA23": 8, "kShlA2": 2, "kShlA3": 6}
    assert Enc.REGISTER_TERMS == ((("id",),), (("rotl", 12),), (("rotl", 8), ("shl", 2)), (("rotl", 8), ("shl", 6)))
    for formula in ("as_bf162(q & kFieldMask)", "as_bf162(rotl(q, kRotA1) & kFieldMask)",
                    "as_bf162((r8 ^ (q << kShlA2)) & kFieldMask)", "as_bf162((r8 ^ (q << kShlA3)) & kFieldMask)",
                    "const uint32_t r8 = rotl(q, kRotA23);"):
        assert formula in header, formula
    assert f"kFieldMask = 0x{Enc.FIELD_MASK:08X}u" in header
    assert f"kScaleBias = 0x{Enc.SCALE_BIAS:04X}{Enc.SCALE_BIAS:04X}u" in header
    assert f"kWeightScaleFold = {Enc.WEIGHT_SCALE_FOLD:.1f}f" in header


def test_quantize_weights_is_per_expert_tensor_scale():
    w = torch.randn(3, 64, 64)
    packed = L.quantize_weights(w)
    codes, block_scales, scale = L.unpack_weights(packed)
    for e in range(3):
        q = nvfp4.quantize(w[e], scale="tensor")
        assert torch.equal(codes[e], q.codes) and torch.equal(scale[e], q.scale)
        assert torch.equal(block_scales[e].view(torch.uint8), q.block_scales.view(torch.uint8))
        # (value * b) * s here vs value * (b * s) in nvfp4.dequantize: equal up to one FP32 rounding
        torch.testing.assert_close(L.dequantize_weights(packed)[e], nvfp4.dequantize(q), rtol=2e-7, atol=0)


def test_interleave_split_roundtrip():
    gate, up = torch.randn(2, 32, 16), torch.randn(2, 32, 16)
    fused = L.interleave_gate_up(gate, up)  # [2, 64, 16]
    assert torch.equal(fused[:, 0:8], gate[:, 0:8]) and torch.equal(fused[:, 8:16], up[:, 0:8])
    g2, u2 = L.split_gate_up(fused.transpose(1, 2))  # columns in fused-row order
    assert torch.equal(g2, gate.transpose(1, 2)) and torch.equal(u2, up.transpose(1, 2))


# ---------------------------------------------------------------------------------------------
# routing
# ---------------------------------------------------------------------------------------------

def test_route_sorts_stably_and_inverts():
    ids = torch.tensor([[2, 0], [0, 1], [2, 3], [0, 2]])
    r = R.route(ids, 5, torch.rand(4, 2))
    assert r.offsets.tolist() == [0, 3, 4, 7, 8, 8]  # expert 4 has zero rows
    assert r.row_index.tolist() == [0, 1, 3, 1, 0, 2, 3, 2]  # within an expert: token order
    for t in range(4):
        for j in range(2):
            m = int(r.slot_rows[t, j])
            assert int(r.row_index[m]) == t and r.offsets[ids[t, j]] <= m < r.offsets[ids[t, j] + 1]
    with pytest.raises(ValueError, match="topk_ids must lie"):
        R.route(torch.tensor([[5]]), 5)


def _offsets(rows_per_expert: list[int]) -> torch.Tensor:
    return torch.tensor([0] + list(itertools.accumulate(rows_per_expert)), dtype=torch.int32)


@pytest.mark.parametrize("tile_tokens", [8, 16, 32, 64, 128])
def test_token_tile_bound_holds_every_routing(tile_tokens):
    """The GEMMs' grid (token_tile_bound) never holds fewer token tiles than a routing has: uniform, skewed and
    single-expert routings, experts without rows, fewer rows than experts; never more than the bound before it."""
    gen = torch.Generator().manual_seed(tile_tokens)
    for experts, tokens, top_k in [(128, 1, 8), (128, 8, 8), (128, 64, 8), (128, 1024, 8), (8, 3, 2), (64, 4096, 4)]:
        for skew in (0.0, 1.0, 3.0):  # expert popularity ~ exp(skew * normal): 0 uniform, 3 very uneven
            prob = torch.exp(skew * torch.randn(experts, generator=gen))
            ids = torch.multinomial(prob.expand(tokens, experts), top_k, generator=gen)  # distinct per token
            routing = R.route(ids, experts)
            m = routing.num_rows
            real = R.token_tiles(routing.offsets, tile_tokens)
            bound = R.token_tile_bound(m, experts, tile_tokens)
            assert real <= bound <= -(-m // tile_tokens) + experts, (experts, tokens, skew, real, bound)
    assert R.token_tiles(_offsets([m := 3 * tile_tokens + 5, 0, 0]), tile_tokens) == 4  # all rows on one expert
    assert R.token_tile_bound(m, 3, tile_tokens) >= 4
    reached = _offsets([1 + tile_tokens * (i % 3) for i in range(20)])  # every expert 1 mod TN rows: equality
    assert R.token_tiles(reached, tile_tokens) == R.token_tile_bound(int(reached[-1]), 20, tile_tokens)
    assert R.token_tile_bound(8, 128, tile_tokens) == 8  # T=1 at top-8: one tile per expert with rows
    assert R.token_tile_bound(0, 128, tile_tokens) == 1  # an empty routing still launches a valid grid


# ---------------------------------------------------------------------------------------------
# reference vs a naive per-slot loop in FP64
# ---------------------------------------------------------------------------------------------

def _naive_slots(a64, s_a, w64, s_w, ids):
    """y[t, j, :] = (a[t] . W_e) * (s_w[e] * s_a[t]) in FP64 for e = ids[t, j]."""
    out = torch.empty(*ids.shape, w64.shape[1], dtype=torch.float64)
    for t in range(ids.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            out[t, j] = (w64[e] @ a64[t]) * float(s_w[e]) * float(s_a[t])
    return out


def _close(got, want, tol=2e-3):
    rel = float((got.double() - want.double()).norm() / want.double().norm())
    assert rel <= tol, rel


@pytest.mark.parametrize("w4a4", [True, False])
def test_plain_matches_naive(problem, w4a4):
    p = problem
    a, s_a = (p.a, p.s_a) if w4a4 else (p.x, None)
    y = G.moe_gemm_ref(a, p.gate_up, p.routing.offsets, row_index=p.routing.row_index, row_scale=s_a)
    ones = torch.ones(T)
    naive = _naive_slots(a.double(), s_a if w4a4 else ones, _dequant64(p.gate_up) / p.gate_up.scale.view(-1, 1, 1).double(),
                         p.gate_up.scale, p.topk_ids)  # [T, k, 2I]
    # sorted row m holds the slot (t, j) with slot_rows[t, j] == m
    flat = naive.reshape(T * K_TOP, -1)
    order = torch.empty(T * K_TOP, dtype=torch.long)
    order[p.routing.slot_rows.reshape(-1).long()] = torch.arange(T * K_TOP)
    _close(y, flat[order], 4e-3)
    y64 = G.moe_gemm_ref(a, p.gate_up, p.routing.offsets, row_index=p.routing.row_index, row_scale=s_a,
                         acc_dtype=torch.float64)
    assert (y64 == flat[order].to(torch.bfloat16)).float().mean() > 0.99


def test_gate_up_fused_matches_naive(problem):
    p = problem
    out = G.moe_gate_up_ref(p.a, p.gate_up, p.routing.offsets, row_index=p.routing.row_index, row_scale=p.s_a)
    w64 = _dequant64(p.gate_up) / p.gate_up.scale.view(-1, 1, 1).double()
    flat = _naive_slots(p.a.double(), p.s_a, w64, p.gate_up.scale, p.topk_ids).reshape(T * K_TOP, -1)
    order = torch.empty(T * K_TOP, dtype=torch.long)
    order[p.routing.slot_rows.reshape(-1).long()] = torch.arange(T * K_TOP)
    gate, up = L.split_gate_up(flat[order])
    h64 = gate * torch.sigmoid(gate) * up
    _close(out.h, h64, 4e-3)
    q = nvfp4.quantize(out.h)
    assert torch.equal(out.q.codes, q.codes) and torch.equal(out.q.scale, q.scale)
    assert torch.equal(out.a_next, nvfp4.dequantize(q, torch.bfloat16, apply_scale=False))
    assert torch.equal(out.mantissa_bits, nvfp4.make_guidance(q).mantissa_bits)


def test_down_combine_matches_naive(problem):
    p = problem
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(T * K_TOP, I, generator=gen).to(torch.bfloat16)  # sorted rows
    s_a = torch.rand(T * K_TOP, generator=gen) + 0.5
    y = G.moe_down_ref(a, p.down, p.routing, row_scale=s_a)  # [T, H]
    w64 = _dequant64(p.down)
    want = torch.zeros(T, H, dtype=torch.float64)
    for t in range(T):
        for j in range(K_TOP):
            m = int(p.routing.slot_rows[t, j])
            e = int(p.topk_ids[t, j])
            want[t] += float(p.routing.row_weight[m]) * float(s_a[m]) * (w64[e] @ a[m].double())
    _close(y, want, 4e-3)


def test_zero_row_experts_and_single_token():
    p = make_problem(8, 128, 64, 2, 1, seed=5)
    assert (p.routing.offsets[1:] - p.routing.offsets[:-1]).eq(0).sum() == 6
    out = G.moe_gate_up_ref(p.a, p.gate_up, p.routing.offsets, row_index=p.routing.row_index, row_scale=p.s_a)
    y = G.moe_down_ref(out.a_next, p.down, p.routing, row_scale=out.q.scale)
    assert y.shape == (1, 128) and torch.isfinite(y.float()).all()


# ---------------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------------

def test_validation_errors(problem):
    p = problem
    off, ri = p.routing.offsets, p.routing.row_index
    call = lambda **kw: G.moe_gemm_ref(**{"a": p.a, "weights": p.gate_up, "offsets": off, "row_index": ri, **kw})  # noqa: E731
    bad = off.clone()
    bad[2] = int(off[3]) + 1  # offsets[3] < offsets[2]
    with pytest.raises(ValueError, match="non-decreasing"):
        call(offsets=bad)
    short = off.clone()
    short[-1] -= 1
    with pytest.raises(ValueError, match="must equal the number of routed rows"):
        call(offsets=short)
    with pytest.raises(TypeError, match="int32"):
        call(offsets=off.long())
    with pytest.raises(ValueError, match=r"shape \[E\+1\]"):
        call(offsets=off[:-1])
    with pytest.raises(ValueError, match="row_index values"):
        call(row_index=ri + T)
    with pytest.raises(TypeError, match="bfloat16"):
        call(a=p.a.float())
    with pytest.raises(ValueError, match="has K="):
        call(a=p.a[:, :64].contiguous())
    with pytest.raises(ValueError, match="row_scale"):
        call(row_scale=torch.ones(3))
    wrong_layout = L.MoEWeights(p.gate_up.codes.reshape(E, -1, 1024), p.gate_up.block_scales, p.gate_up.scale)
    with pytest.raises(ValueError, match="fragment-ordered"):
        call(weights=wrong_layout)
    nan_a = p.a.clone()
    nan_a[1, 3] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        call(a=nan_a)
    with pytest.raises(ValueError, match="N % 64"):
        L.quantize_weights(torch.randn(1, 48, 64))


# ---------------------------------------------------------------------------------------------
# torch ops: CPU tensors dispatch to the reference; fake impls agree with real outputs
# ---------------------------------------------------------------------------------------------

def test_custom_ops_cpu_and_fake(problem):
    from trace_kernels import moe_gemm as ops
    p = problem
    r, w, d = p.routing, p.gate_up, p.down
    args = (p.a, w.codes, w.block_scales, w.scale, r.offsets, r.row_index, p.s_a, 0)
    y = torch.ops.trace_kernels.moe_gemm(*args)
    assert torch.equal(y, G.moe_gemm_ref(p.a, w, r.offsets, row_index=r.row_index, row_scale=p.s_a))
    h, codes, bscales, scale, a_next, bits = torch.ops.trace_kernels.moe_gate_up(*args)
    want = G.moe_gate_up_ref(p.a, w, r.offsets, row_index=r.row_index, row_scale=p.s_a)
    assert torch.equal(codes, want.q.codes) and torch.equal(bits, want.mantissa_bits)
    down_args = (a_next, d.codes, d.block_scales, d.scale, r.offsets, r.row_index, r.slot_rows, r.row_weight, scale, 0)
    out = torch.ops.trace_kernels.moe_down(*down_args)
    assert torch.equal(out, G.moe_down_ref(a_next, d, r, row_scale=scale))
    # fp8 inputs rule out opcheck's schema test (allclose on float8); the fake-tensor test applies
    for op, a in ((ops.moe_gemm_op, args), (ops.moe_gate_up_op, args), (ops.moe_down_op, down_args)):
        torch.library.opcheck(op, a, test_utils=("test_faketensor",))


def test_row_amax_fold_is_the_float_amax():
    """The row_amax tiles' fold (moe_nvfp4_row.cuh, fold_row_amax): an unsigned max over |h|'s BF16 bits widened to
    float bits, in any order and grouping, is bit for bit the float amax of finite rows (zeros, -0, subnormals and the
    largest BF16 included), whose row scale is nvfp4.quantize's, and is non-finite exactly where a row holds inf or
    NaN."""
    gen = torch.Generator().manual_seed(3)
    h = (torch.randn(64, 768, generator=gen) * torch.exp2(torch.randint(-140, 120, (64, 1), generator=gen))).bfloat16()
    h[0] = 0
    h[1] = -0.0
    h[2, ::3] = torch.finfo(torch.bfloat16).tiny / 8  # subnormal BF16
    h[3, 5] = -torch.finfo(torch.bfloat16).max
    h[4, 7], h[5, 9], h[6, 1], h[6, 2] = float("inf"), float("-inf"), float("nan"), float("inf")
    bits = (h.view(torch.int16).to(torch.int64) & 0x7FFF) << 16  # abs_bits: the float bits of |h|
    perm = torch.randperm(h.shape[1], generator=gen)
    for folded in (bits.amax(dim=1), bits[:, perm].view(64, 48, 16).amax(dim=2).amax(dim=1)):  # (any grouping)
        amax = folded.to(torch.int32).view(torch.float32)
        finite = torch.isfinite(h.float()).all(dim=1)
        assert not torch.isfinite(amax[~finite]).any() and bool((~finite).sum() == 3)
        want = h[finite].float().abs().amax(dim=1)
        assert torch.equal(amax[finite], want)
        # the kernel's row scale from it (__fdiv_rn) is quantize's
        s = amax[finite] / torch.full_like(want, nvfp4.GLOBAL_SCALE_DIVISOR)
        assert torch.equal(s, nvfp4.quantize(h[finite], scale="row").scale)
