"""Paged KV cache references (CPU): append bit-exact with nvfp4, decode vs naive FP64, extend, checks."""

import pytest
import torch

from trace_kernels import attention, kv_cache, kv_codes, kv_testing, nvfp4, shapes
from trace_kernels.kv_append import kv_append
from trace_kernels.kv_gather import kv_gather


def _bytes(t):
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("head_dim,page_size", [(64, 16), (128, 64)])
def test_append_bit_exact_and_guidance(head_dim, page_size):
    case = kv_testing.make_case([5, 37, 1], 8, 2, head_dim, page_size, "nvfp4", seed=1, fill=False)
    k, v = case.k_all, case.v_all
    k[3, 1, :16] = 0  # a zero block
    v[7] = 0  # a zero row (s == 0)
    g = kv_append(k, v, case.slot_mapping, case.k_cache, case.v_cache, guidance=True)
    for x, pages, guide in ((k, case.k_cache, g.k), (v, case.v_cache, g.v)):
        q = nvfp4.quantize(x, scale="row")
        flat = lambda t: t.flatten(0, 1)[case.slot_mapping]  # noqa: E731
        assert torch.equal(kv_codes.decode_codes(flat(pages.codes)), q.codes)
        assert torch.equal(flat(pages.codes), kv_codes.encode_codes(q.codes))  # the cache layout
        assert torch.equal(_bytes(flat(pages.block_scales)), _bytes(q.block_scales))
        assert torch.equal(flat(pages.scale).view(torch.int32), q.scale.view(torch.int32))
        ref = nvfp4.make_guidance(q)
        assert torch.equal(guide.mantissa_bits, ref.mantissa_bits)
        assert torch.equal(_bytes(guide.block_scales), _bytes(ref.block_scales))
        assert torch.equal(guide.scale.view(torch.int32), ref.scale.view(torch.int32))
    # slots nobody wrote stay untouched (zero)
    written = torch.zeros(case.k_cache.scale.flatten(0, 1).shape[0], dtype=torch.bool)
    written[case.slot_mapping] = True
    assert not case.k_cache.codes.flatten(0, 1)[~written].any()


def test_append_bf16_pages():
    case = kv_testing.make_case([9, 20], 4, 4, 64, 16, "bf16", seed=2, fill=False)
    assert kv_append(case.k_all, case.v_all, case.slot_mapping, case.k_cache, case.v_cache) is None
    assert torch.equal(case.v_cache.data.flatten(0, 1)[case.slot_mapping], case.v_all)


DECODE_CASES = [  # lengths, Hq, Hkv, D, P
    ([1, 17, 200], 8, 8, 64, 16),     # GQA 1
    ([64, 3, 129], 16, 4, 128, 16),   # GQA 4
    ([300, 1, 65], 32, 4, 128, 64),   # GQA 8
    ([1000, 48], 8, 1, 64, 64),       # GQA 8, long
    ([90, 5], 10, 2, 128, 16),        # GQA 5 (Llama 4)
]


@pytest.mark.parametrize("cache_format", ["nvfp4", "bf16"])
@pytest.mark.parametrize("lengths,hq,hkv,d,p", DECODE_CASES)
def test_decode_reference_vs_naive_fp64(cache_format, lengths, hq, hkv, d, p):
    case = kv_testing.make_case(lengths, hq, hkv, d, p, cache_format, seed=len(lengths) * d + p)
    out = attention.decode_attention(case.q, case.k_cache, case.v_cache, case.block_table, case.lengths)
    ref = kv_testing.naive_attention_fp64(case)
    assert out.dtype == torch.bfloat16 and out.shape == case.q.shape
    err = (out.double() - ref).abs()
    # the only differences: FP32 vs FP64 arithmetic and the final BF16 rounding (2^-9 relative)
    assert (err <= ref.abs() * 2**-8 + 1e-6 * ref.abs().max()).all(), float(err.max())


def test_extend_reads_the_decode_values():
    case = kv_testing.make_case([40, 7, 96], 8, 2, 64, 16, "nvfp4", seed=5)
    tq = 4
    q = torch.randn(3, tq, 8, 64, dtype=torch.float32)
    out = attention.extend_attention(q, case.k_cache, case.v_cache, case.block_table, case.lengths)  # [B, Tq, Hq, D]
    # query i of sequence b sits at position len - tq + i and sees the cache up to there (FP64 naive)
    for b, n in enumerate(case.lengths.tolist()):
        for i in range(tq):
            pos = n - tq + i
            if pos < 0:
                continue
            sub = kv_testing.PagedCase(q[b:b + 1, i].to(torch.bfloat16), [], [], case.k_cache, case.v_cache,
                                       case.block_table[b:b + 1], torch.tensor([pos + 1], dtype=torch.int32),
                                       case.slot_mapping)
            sub.q = q[b:b + 1, i]  # FP32 query: naive_attention_fp64 upcasts it exactly
            ref = kv_testing.naive_attention_fp64(sub)[0]
            torch.testing.assert_close(out[b, i].double(), ref, rtol=1e-4, atol=1e-5)


def test_extend_bf16_matches_decode_on_last_token():
    case = kv_testing.make_case([33, 80], 16, 4, 128, 16, "nvfp4", seed=6)
    dec = attention.decode_attention(case.q, case.k_cache, case.v_cache, case.block_table, case.lengths)
    ext = attention.extend_attention(case.q[:, None], case.k_cache, case.v_cache, case.block_table, case.lengths)
    # BF16 K/V in SDPA (one rounding of the dequantized values) vs FP32 decode
    torch.testing.assert_close(ext[:, 0].float(), dec.float(), rtol=2e-2, atol=2e-2)


def test_engine_pages_plug_in():
    """trace_rl's engine pages (same attribute names and layout) work with these functions."""
    engine_kv = pytest.importorskip("trace_rl.engine.kv_cache")
    pages_k = engine_kv.KVPages(6, 16, 2, 64, torch.bfloat16, "cpu", quantized=True)
    pages_v = engine_kv.KVPages(6, 16, 2, 64, torch.bfloat16, "cpu", quantized=True)
    geom = kv_cache.cache_geometry(pages_k, pages_v)
    assert (geom.num_pages, geom.page_size, geom.kv_heads, geom.head_dim, geom.nvfp4) == (6, 16, 2, 64, True)
    x = kv_testing.random_rows(20, 2, 64, torch.Generator().manual_seed(0))
    slots = torch.arange(16, 36, dtype=torch.int64)
    kv_append(x, x, slots, pages_k, pages_v)
    assert torch.equal(pages_k.gather(slots[None])[0].float(),
                       nvfp4.dequantize(nvfp4.quantize(x)).to(torch.bfloat16).float())


# ----------------------------------------------------------------------------------------------
# Validation: clear exceptions before anything runs
# ----------------------------------------------------------------------------------------------

def _case():
    return kv_testing.make_case([20, 5], 8, 2, 64, 16, "nvfp4", seed=9)


def test_decode_rejects_length_beyond_table():
    c = _case()
    lengths = torch.tensor([20, 16 * c.block_table.shape[1] + 1], dtype=torch.int32)
    with pytest.raises(ValueError, match="lengths\\[1\\]"):
        attention.decode_attention(c.q, c.k_cache, c.v_cache, c.block_table, lengths)
    with pytest.raises(ValueError, match="outside"):
        attention.decode_attention(c.q, c.k_cache, c.v_cache, c.block_table, torch.tensor([0, 5], dtype=torch.int32))


def test_decode_rejects_bad_pages_and_types():
    c = _case()
    table = c.block_table.clone()
    table[1, 0] = -1
    with pytest.raises(ValueError, match="block_table\\[1, 0\\]"):
        attention.decode_attention(c.q, c.k_cache, c.v_cache, table, c.lengths)
    with pytest.raises(TypeError, match="int32"):
        attention.decode_attention(c.q, c.k_cache, c.v_cache, c.block_table.long(), c.lengths)
    with pytest.raises(TypeError, match="bfloat16"):
        attention.decode_attention(c.q.float(), c.k_cache, c.v_cache, c.block_table, c.lengths)
    with pytest.raises(ValueError, match="multiple"):
        attention.decode_attention(c.q[:, :3], c.k_cache, c.v_cache, c.block_table, c.lengths)
    with pytest.raises(ValueError, match="head_dim"):
        attention.decode_attention(c.q[..., :32], c.k_cache, c.v_cache, c.block_table, c.lengths)
    with pytest.raises(ValueError, match="differ"):
        bf16 = kv_cache.allocate_bf16_pages(*c.k_cache.scale.shape, 64)
        attention.decode_attention(c.q, c.k_cache, bf16, c.block_table, c.lengths)
    for scale in (float("nan"), float("inf"), 0.0, -0.125):  # NaN outputs (or none) without an error otherwise
        with pytest.raises(ValueError, match="softmax_scale must be a positive finite number"):
            attention.decode_attention(c.q, c.k_cache, c.v_cache, c.block_table, c.lengths, softmax_scale=scale)
        with pytest.raises(ValueError, match="softmax_scale must be a positive finite number"):
            attention.extend_attention(c.q[:, None], c.k_cache, c.v_cache, c.block_table, c.lengths,
                                       softmax_scale=scale)
    assert attention.decode_attention(c.q, c.k_cache, c.v_cache, c.block_table, c.lengths,
                                      softmax_scale=0.1).isfinite().all()


def test_append_rejects_bad_slots_and_inputs():
    c = _case()
    k, v = c.k_all, c.v_all
    for bad, pattern in ((-1, "slot_mapping\\[0\\] = -1"), (c.k_cache.scale.shape[0] * 16, "outside")):
        slots = c.slot_mapping.clone()
        slots[0] = bad
        with pytest.raises(ValueError, match=pattern):
            kv_append(k, v, slots, c.k_cache, c.v_cache)
    slots = c.slot_mapping.clone()
    slots[1] = slots[0]
    with pytest.raises(ValueError, match="repeated"):
        kv_append(k, v, slots, c.k_cache, c.v_cache)
    with pytest.raises(TypeError, match="int64"):
        kv_append(k, v, c.slot_mapping.int(), c.k_cache, c.v_cache)
    with pytest.raises(TypeError, match="bfloat16"):
        kv_append(k.float(), v, c.slot_mapping, c.k_cache, c.v_cache)
    with pytest.raises(ValueError, match="\\[T, Hkv, D\\]"):
        kv_append(k[:, :1], v[:, :1], c.slot_mapping, c.k_cache, c.v_cache)
    bad = k.clone()
    bad[2, 1, 5] = float("nan")
    before = c.k_cache.codes.clone()
    with pytest.raises(ValueError, match="non-finite"):
        kv_append(bad, v, c.slot_mapping, c.k_cache, c.v_cache)
    assert torch.equal(before, c.k_cache.codes)  # nothing written
    bf16 = kv_cache.allocate_bf16_pages(4, 16, 2, 64)
    with pytest.raises(ValueError, match="guidance"):
        kv_append(k[:10], v[:10], torch.arange(10), bf16, bf16, guidance=True)


# ----------------------------------------------------------------------------------------------
# Codegen: names, rendering, one compile per kernel family (CI has 2 cores)
# ----------------------------------------------------------------------------------------------

def test_kernel_names_and_shapes():
    from trace_kernels import shapes
    from trace_kernels.codegen.ops import decode_attention, kv_append as kv_codegen, kv_gather as gather_codegen
    assert decode_attention.spec("nvfp4", 32, 4, 128, 16, "mma4l").name == \
        "decode_attention_nvfp4_mma4l_hq32_hkv4_d128_p16_sm90a"
    assert kv_codegen.spec("nvfp4", 4, 128).name == "kv_append_nvfp4_hkv4_d128_sm90a"
    assert kv_codegen.spec("nvfp4", 4, 128, "b2").launch["rows_per_cta"] == 2 * kv_codegen.spec("nvfp4", 4, 128).launch[
        "rows_per_cta"]
    assert kv_codegen.spec("nvfp4", 4, 128, "b4").launch["rows_per_cta"] == 4 * kv_codegen.spec("nvfp4", 4, 128).launch[
        "rows_per_cta"]
    with pytest.raises(ValueError, match="NVFP4 pages only"):
        kv_codegen.spec("bf16", 4, 128, "b2")
    with pytest.raises(ValueError, match="fewer than 4 blocks"):
        kv_codegen.spec("nvfp4", 4, 32, "b4")
    small_cta = kv_codegen.spec("nvfp4", 4, 128, "b2_cta128")  # the CTA size in the variant's name
    assert small_cta.name == "kv_append_nvfp4_b2_cta128_hkv4_d128_sm90a"
    assert (small_cta.launch["threads"], small_cta.launch["rows_per_cta"]) == (128, 32)
    assert "128" in small_cta.render() and kv_codegen.spec("nvfp4", 4, 128, "b2").launch["threads"] == kv_codegen.CTA
    with pytest.raises(ValueError, match="variant"):
        kv_codegen.spec("nvfp4", 4, 128, "b2_cta96")
    # "_mbN": the CTAs per SM the registers must allow (__launch_bounds__' second argument)
    bounded = kv_codegen.spec("nvfp4", 4, 128, "b2_cta128_mb12")
    assert bounded.name == "kv_append_nvfp4_b2_cta128_mb12_hkv4_d128_sm90a"
    assert "__launch_bounds__(128, 12)" in bounded.render() and "__launch_bounds__(128)" in small_cta.render()
    assert bounded.launch == small_cta.launch
    for bad in ("b2_mb0", "b2_mb17", "b2_mb12_cta128", "b2_cta512_mb5"):
        with pytest.raises(ValueError, match="variant"):
            kv_codegen.spec("nvfp4", 4, 128, bad)
    # what an append launches: BF16 pages their one kernel whatever the NVFP4 default is
    from trace_kernels.kv_append import DEFAULT_NVFP4_VARIANT, kernel_spec
    assert kernel_spec(False, 4, 128) == kv_codegen.spec("bf16", 4, 128)
    assert kernel_spec(True, 4, 128) == kv_codegen.spec("nvfp4", 4, 128, DEFAULT_NVFP4_VARIANT)
    assert kernel_spec(True, 4, 128, "b4") == kv_codegen.spec("nvfp4", 4, 128, "b4")
    # head_dim 16 has one block per row: the default takes b1 there, and the shape's kernels render
    assert kernel_spec(True, 2, 16) == kv_codegen.spec("nvfp4", 2, 16, "b1")
    with pytest.raises(ValueError, match="fewer than 2 blocks"):
        kv_codegen.spec("nvfp4", 2, 16, DEFAULT_NVFP4_VARIANT)
    d16 = shapes.parse_custom("E=8,H=256,I=128,k=2,hq=4,hkv=2,hd=16")
    assert {s.name for s in kv_codegen.specs_for_shape(d16)} == {"kv_append_nvfp4_hkv2_d16_sm90a",
                                                                  "kv_append_bf16_hkv2_d16_sm90a"}
    assert decode_attention.spec("bf16", 64, 4, 128, 64, "mma").launch["head_groups"] == 1  # GQA 16: 16 MMA rows
    mma2 = decode_attention.spec("nvfp4", 64, 4, 128, 16, "mma2_w2s2")  # tokens as MMA rows, <= 8 heads per CTA
    assert mma2.name == "decode_attention_nvfp4_mma2_w2s2_hq64_hkv4_d128_p16_sm90a" and mma2.launch["head_groups"] == 2
    assert "decode_attention_mma2<Config>" in mma2.render()
    for variant in ("mma2_w2s2", "mma4l"):
        with pytest.raises(ValueError, match="NVFP4 pages only"):
            decode_attention.spec("bf16", 32, 4, 128, 16, variant)
    with pytest.raises(ValueError, match="BF16 pages only"):
        decode_attention.spec("nvfp4", 32, 4, 128, 16, "mma")
    # removed variants (the last tree with them: 9d9c541) are refused by name
    for removed in ("simt", "mma2", "mma3", "mma3_w1s3", "mma4", "mma4_w1s2"):
        with pytest.raises(ValueError, match="variant must be"):
            decode_attention.spec("nvfp4", 32, 4, 128, 16, removed)
    # GQA groups that are not powers of two (Llama 4: 5, MiniMax: 6, GLM-4.5: 12): the largest divisor of the group a
    # CTA takes, so every CTA of a kv head computes the same number of q heads
    for (hq, hkv), expect in {(40, 8): {"mma": 5, "mma2_w2s2": 5, "mma4l": 5},
                              (12, 2): {"mma": 6, "mma2_w2s2": 6, "mma4l": 6},
                              (96, 8): {"mma": 12, "mma2_w2s2": 6, "mma4l": 6}}.items():
        for variant, heads in expect.items():
            launch = decode_attention.spec("bf16" if variant == "mma" else "nvfp4", hq, hkv, 128, 16, variant).launch
            assert (launch["heads_per_cta"], launch["head_groups"]) == (heads, hq // hkv // heads), (hq, hkv, variant)
    assert decode_attention.heads_per_cta(7, 8) == 7 and decode_attention.heads_per_cta(12, 8) == 6
    with pytest.raises(ValueError, match="do not divide the group"):
        decode_attention.spec("nvfp4", 24, 4, 128, 16, "mma2_w2s2h4")  # an explicit 4 heads per CTA in a group of 6
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        decode_attention.spec("nvfp4", 24, 5, 128, 16, "mma4l")
    with pytest.raises(ValueError, match="head_dim"):
        decode_attention.spec("nvfp4", 8, 1, 96, 16, "mma4l")
    for preset in shapes.PRESETS.values():
        for s in decode_attention.specs_for_shape(preset) + kv_codegen.specs_for_shape(preset):
            assert s.render() == s.render() and s.name in s.render()


def test_mma2_configurations():
    """mma2 occupancy configurations (warps, stages, min blocks, heads per CTA): named apart, refused when they do not
    fit or their grammar is off."""
    from trace_kernels.codegen.ops import decode_attention
    fallback = decode_attention.spec("nvfp4", 32, 4, 128, 16, "mma2_w2s2")
    assert "__launch_bounds__(Config::kThreads) " in fallback.render()  # no min-blocks argument
    assert fallback.launch["tile_tokens"] == 64 and fallback.launch["stages"] == 2
    assert fallback.launch["ctas_per_split"] == 4  # one kv head each
    w4 = decode_attention.spec("nvfp4", 32, 4, 128, 16, "mma2_w4s2b4h4")
    assert w4.name == "decode_attention_nvfp4_mma2_w4s2b4h4_hq32_hkv4_d128_p16_sm90a"
    launch = w4.launch
    assert (launch["threads"], launch["tile_tokens"], launch["stages"], launch["head_groups"]) == (128, 128, 2, 2)
    src = w4.render()
    assert "__launch_bounds__(Config::kThreads, 4)" in src and "/*WARPS=*/4, /*STAGES=*/2" in src
    for variant in decode_attention.CONFIG_TEST_VARIANTS:
        for shape in decode_attention.CONFIG_TEST_SHAPES:
            assert variant in decode_attention.spec("nvfp4", *shape, variant).name
    for bad, match in (("mma2_w4s3", "shared memory"), ("mma2_w8s2", "warps"), ("mma2_w2s2h3", "heads"),
                       ("mma2_w2", "variant must be")):
        with pytest.raises(ValueError, match=match):
            decode_attention.spec("nvfp4", 32, 4, 128, 16, bad)


def test_mma4l_configurations():
    """mma4l (whole pages per CTA): one CTA per (sequence, split, head group), dynamic shared memory
    sized like the header's stage layout, min blocks for 16 warps per SM, unsupported shapes refused."""
    from trace_kernels.codegen.ops import decode_attention
    default = decode_attention.spec("nvfp4", 32, 4, 128, 16, "mma4l")
    assert default.name == "decode_attention_nvfp4_mma4l_hq32_hkv4_d128_p16_sm90a"
    launch = default.launch
    assert (launch["threads"], launch["tile_tokens"], launch["stages"], launch["ctas_per_split"]) == (256, 64, 2, 1)
    # stage: 64 tokens x 4 heads x (K, V) x (64 code + 8 scale + 4 row-scale bytes) + mbarrier, 128-aligned
    assert launch["smem"] == 2 * (-(-(64 * 4 * 2 * 76 + 8) // 128) * 128) == 78080
    src = default.render()
    assert "__launch_bounds__(Config::kThreads, 2)" in src and "/*WARPS_PER_HEAD=*/2, /*STAGES=*/2" in src
    assert "decode_attention_mma4<Config, /*kLean=*/true>(params)" in src
    w1 = decode_attention.spec("nvfp4", 32, 4, 128, 16, "mma4l_w1s2b4")
    assert w1.name == "decode_attention_nvfp4_mma4l_w1s2b4_hq32_hkv4_d128_p16_sm90a" and w1.launch["threads"] == 128
    gqa16 = decode_attention.spec("nvfp4", 64, 4, 128, 16, "mma4l").launch
    assert (gqa16["head_groups"], gqa16["ctas_per_split"]) == (2, 2)
    assert "__launch_bounds__(Config::kThreads, 1)" in decode_attention.spec("nvfp4", 8, 8, 64, 16, "mma4l").render()
    assert "__launch_bounds__(Config::kThreads, 3)" in decode_attention.spec("nvfp4", 32, 4, 128, 16,
                                                                             "mma4l_w1s3b3").render()
    for shape, bad, match in (((32, 4, 128, 24), "mma4l", "page size"), ((32, 4, 128, 16), "mma4l_w3s2", "warps"),
                              ((32, 4, 128, 16), "mma4l_w4s3", "shared memory"),
                              ((256, 16, 128, 16), "mma4l_w4s2", "warps per CTA")):
        with pytest.raises(ValueError, match=match):
            decode_attention.spec("nvfp4", *shape, bad)
    # the public op accepts the variant (CPU tensors: the reference) and refuses shapes it does not take
    c = _case()
    out = attention.decode_attention(c.q, c.k_cache, c.v_cache, c.block_table, c.lengths, variant="mma4l")
    ref = attention.decode_attention_reference(c.q, c.k_cache, c.v_cache, c.block_table, c.lengths)
    assert torch.equal(out, ref)
    c24 = kv_testing.make_case([20, 5], 8, 2, 64, 24, "nvfp4", seed=9)
    with pytest.raises(ValueError, match="page size"):
        attention.decode_attention(c24.q, c24.k_cache, c24.v_cache, c24.block_table, c24.lengths, variant="mma4l")


def test_mma4l_wide_configurations():
    """mma4l_c16: a GQA group of 9-16 q heads per kv head in one CTA (two MMA column blocks), 8 warps and 4 stages by
    default; refused for groups one column block takes, and accepted by the public op."""
    from trace_kernels.codegen.ops import decode_attention
    qwen235 = decode_attention.spec("nvfp4", 64, 4, 128, 16, "mma4l_c16")
    assert qwen235.name == "decode_attention_nvfp4_mma4l_c16_hq64_hkv4_d128_p16_sm90a"
    launch = qwen235.launch
    assert (launch["heads_per_cta"], launch["head_groups"], launch["ctas_per_split"]) == (16, 1, 1)  # K/V read once
    assert (launch["threads"], launch["tile_tokens"], launch["stages"]) == (256, 64, 4)
    assert launch["smem"] == 4 * (-(-(64 * 4 * 2 * 76 + 8) // 128) * 128)
    src = qwen235.render()
    assert "/*HEADS_PER_CTA=*/16" in src and "__launch_bounds__(Config::kThreads, 1)" in src
    glm = decode_attention.spec("nvfp4", 96, 8, 128, 16, "mma4l_c16").launch  # 8 kv heads: 1 warp each
    assert (glm["heads_per_cta"], glm["ctas_per_split"], glm["threads"], glm["tile_tokens"]) == (12, 1, 256, 32)
    w1 = decode_attention.spec("nvfp4", 64, 4, 128, 16, "mma4l_w1s2_c16")
    assert w1.name == "decode_attention_nvfp4_mma4l_w1s2_c16_hq64_hkv4_d128_p16_sm90a"
    assert (w1.launch["threads"], w1.launch["stages"]) == (128, 2) and "(Config::kThreads, 2)" in w1.render()
    assert decode_attention.heads_per_cta(24, 16) == 12  # a group of 24: two CTAs of 12 per kv head
    for variant in decode_attention.WIDE_TEST_VARIANTS:
        for shape in decode_attention.WIDE_TEST_SHAPES:
            assert variant in decode_attention.spec("nvfp4", *shape, variant).name
    for shape, bad, match in (((32, 4, 128, 16), "mma4l_c16", "groups above 8"),
                              ((8, 8, 64, 16), "mma4l_w1s2_c16", "groups above 8"),
                              ((64, 4, 128, 16), "mma4l_w2_c16", "variant must be"),
                              ((64, 4, 128, 16), "mma4l_c8", "variant must be")):
        with pytest.raises(ValueError, match=match):
            decode_attention.spec("nvfp4", *shape, bad)
    c = kv_testing.make_case([40, 3], 16, 1, 64, 16, "nvfp4", seed=5)  # CPU tensors: the reference
    out = attention.decode_attention(c.q, c.k_cache, c.v_cache, c.block_table, c.lengths, variant="mma4l_c16")
    assert torch.equal(out, attention.decode_attention_reference(c.q, c.k_cache, c.v_cache, c.block_table, c.lengths))
    c8 = _case()
    with pytest.raises(ValueError, match="groups above 8"):
        attention.decode_attention(c8.q, c8.k_cache, c8.v_cache, c8.block_table, c8.lengths, variant="mma4l_c16")


@pytest.mark.nvcc
def test_kernels_compile_for_sm90a_without_spills(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from trace_kernels.codegen.ops import decode_attention, kv_append as kv_codegen, kv_gather as gather_codegen
    from trace_kernels.jit import compiler
    nvcc = compiler.find_nvcc()
    specs = [decode_attention.spec("nvfp4", 32, 4, 128, 16, "mma2_w2s2"),
             decode_attention.spec("nvfp4", 32, 4, 128, 16, "mma4l"),
             decode_attention.spec("nvfp4", 10, 2, 128, 16, "mma4l"),  # GQA 5: 5 of the MMA's 8 columns
             decode_attention.spec("nvfp4", 64, 4, 128, 16, "mma4l_c16"),  # GQA 16: two column blocks
             decode_attention.spec("bf16", 24, 2, 64, 64, "mma"),  # GQA 12: 12 MMA rows
             kv_codegen.spec("nvfp4", 4, 128), gather_codegen.spec("bf16", 4, 128)]

    def build(spec):
        src = tmp_path / f"{spec.name}.cu"
        src.write_text(spec.render())
        return compiler.compile_cubin(spec, src, tmp_path / f"{spec.name}.cubin", nvcc)

    with ThreadPoolExecutor(2) as pool:
        reports = list(pool.map(build, specs))
    for spec, report in zip(specs, reports):
        assert (tmp_path / f"{spec.name}.cubin").stat().st_size > 0
        assert report.spill_stores == report.spill_loads == report.stack_frame == 0, report.text
        assert "warning" not in report.text, report.text


def test_decode_op_traces_with_fake_tensors():
    """decode_attention runs through a torch.library custom op with a fake impl (torch.compile)."""
    c = _case()
    args = (c.q, c.k_cache.codes, c.v_cache.codes, c.k_cache.block_scales, c.v_cache.block_scales, c.k_cache.scale,
            c.v_cache.scale, c.block_table, c.lengths, 0.125, 0, "")
    # test_schema is left out: it does arithmetic on the float8 inputs, which CPU torch lacks
    result = torch.library.opcheck(attention.paged_decode_attention_op, args,
                                   test_utils=("test_faketensor", "test_aot_dispatch_dynamic"))
    assert set(result.values()) == {"SUCCESS"}


def test_append_ops_trace_with_fake_tensors():
    c = kv_testing.make_case([20, 5], 8, 2, 64, 16, "nvfp4", seed=9, fill=False)
    args = (c.k_all, c.v_all, c.slot_mapping, c.k_cache.codes, c.k_cache.block_scales, c.k_cache.scale,
            c.v_cache.codes, c.v_cache.block_scales, c.v_cache.scale, True)
    from trace_kernels import kv_append as kv_append_module
    result = torch.library.opcheck(kv_append_module.kv_append_nvfp4_op, args, test_utils=("test_faketensor",))
    assert set(result.values()) == {"SUCCESS"}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("cache_format", ["nvfp4", "bf16"])
def test_kv_gather_reference_is_nvfp4_dequantize_per_sequence(cache_format, dtype):
    case = kv_testing.make_case([5, 37, 16], 8, 2, 64, 16, cache_format, seed=11)
    positions = case.block_table.shape[1] * 16
    keys, values = kv_gather(case.k_cache, case.v_cache, case.block_table, case.lengths, dtype=dtype)
    assert keys.shape == values.shape == (3, positions, 2, 64) and keys.dtype == dtype
    for b, n in enumerate(case.lengths.tolist()):
        for got, rows in ((keys, case.k[b]), (values, case.v[b])):
            want = nvfp4.dequantize(nvfp4.quantize(rows)).to(dtype) if cache_format == "nvfp4" else rows.to(dtype)
            assert torch.equal(got[b, :n].view(torch.uint8), want.view(torch.uint8))  # -0.0 included
            assert not got[b, n:].view(torch.uint8).any()  # past the length: +0, pages not read
    short = kv_gather(case.k_cache, case.v_cache, case.block_table, case.lengths, positions=20, dtype=dtype)[1]
    assert torch.equal(short, values[:, :20])


def test_kv_gather_rejects_bad_input():
    c = kv_testing.make_case([5, 37], 8, 2, 64, 16, "nvfp4", seed=12)
    capacity = c.block_table.shape[1] * 16
    with pytest.raises(TypeError, match="dtype"):
        kv_gather(c.k_cache, c.v_cache, c.block_table, c.lengths, dtype=torch.float64)
    for positions in (0, capacity + 1, 3.0):
        with pytest.raises(ValueError, match="positions"):
            kv_gather(c.k_cache, c.v_cache, c.block_table, c.lengths, positions=positions)
    with pytest.raises(ValueError, match="lengths"):
        kv_gather(c.k_cache, c.v_cache, c.block_table, c.lengths * 100)
    with pytest.raises(TypeError, match="int32"):
        kv_gather(c.k_cache, c.v_cache, c.block_table.long(), c.lengths)
    with pytest.raises(ValueError, match="items"):
        kv_gather(c.k_cache, c.v_cache, c.block_table, c.lengths, items=3)


def test_kv_gather_op_traces_with_fake_tensors():
    c = kv_testing.make_case([20, 5], 8, 2, 64, 16, "nvfp4", seed=13)
    args = (c.k_cache.codes, c.k_cache.block_scales, c.k_cache.scale, c.v_cache.codes, c.v_cache.block_scales,
            c.v_cache.scale, c.block_table, c.lengths, 32, torch.bfloat16, 2)
    from trace_kernels import kv_gather as kv_gather_module
    result = torch.library.opcheck(kv_gather_module.kv_gather_nvfp4_op, args, test_utils=("test_faketensor",))
    assert set(result.values()) == {"SUCCESS"}


def test_extend_rejects_q_dtypes_it_cannot_gather_in():
    c = kv_testing.make_case([20, 5], 8, 2, 64, 16, "nvfp4", seed=14)
    q = torch.randn(2, 3, 8, 64, dtype=torch.float64)
    with pytest.raises(TypeError, match="q must be bfloat16, float16 or float32"):
        attention.extend_attention(q, c.k_cache, c.v_cache, c.block_table, c.lengths)


def test_nvfp4_page_arg_is_the_page_pointers_by_value():
    c = kv_testing.make_case([20], 8, 2, 64, 16, "nvfp4", seed=15)
    ctype, value = kv_cache.nvfp4_page_arg(c.k_cache)
    passed = ctype(value)  # what CudaKernel.launch hands the driver
    assert (passed.codes, passed.block_scales, passed.scale) == (
        c.k_cache.codes.data_ptr(), c.k_cache.block_scales.data_ptr(), c.k_cache.scale.data_ptr())
