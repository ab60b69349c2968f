"""kv_append, decode_attention and kv_gather kernels on the GPU vs the references, outputs poisoned (H200)."""

import functools

import pytest
import torch

from trace_kernels import attention, kv_cache, kv_codes, kv_testing, nvfp4
from trace_kernels.codegen.ops import decode_attention as decode_attention_codegen
from trace_kernels.kv_append import kv_append, kv_append_reference
from trace_kernels.kv_gather import kv_gather, kv_gather_reference
from trace_kernels.runtime import capture_graph

pytestmark = pytest.mark.gpu
DEV = "cuda"


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setenv("TRACE_KERNELS_POISON_OUTPUTS", "1")


def _poisoned_pages(pages):
    out = kv_testing.pages_to(pages, DEV)
    for t in kv_cache.page_tensors(out):
        t.view(torch.uint8).fill_(0xFF)
    return out


def _bytes(t):
    return t.contiguous().view(torch.uint8)


def _assert_pages_equal(a, b):
    for x, y in zip(kv_cache.page_tensors(a), kv_cache.page_tensors(b)):
        assert torch.equal(_bytes(x).cpu(), _bytes(y).cpu())


def _special_rows(k: torch.Tensor) -> torch.Tensor:
    k = k.clone()
    n = k.shape[0]
    k[0] = 0  # zero row: s == 0
    k[1 % n, 0, :16] = 0  # zero block
    k[2 % n, 0, 3] = 3.0e38  # huge outlier: the other blocks' scales underflow to E4M3 subnormals / zero
    k[3 % n, -1] *= 1e-30  # tiny row
    return k


@pytest.mark.parametrize("cache_format,variant", [("nvfp4", "b1"), ("nvfp4", "b2"), ("nvfp4", "b4"),
                                                  ("nvfp4", "b2_cta128"), ("nvfp4", "b2_cta128_mb12"),
                                                  ("bf16", None)])
@pytest.mark.parametrize("lengths,hkv,d,p", [([1, 33, 250], 2, 64, 16), ([700, 5], 4, 128, 64),
                                             ([3000] * 6, 8, 128, 16), ([40, 300], 2, 256, 16)])
def test_kv_append_bit_exact(cache_format, variant, lengths, hkv, d, p):
    case = kv_testing.make_case(lengths, hkv, hkv, d, p, cache_format, seed=sum(lengths) + d, fill=False)
    k, v = _special_rows(case.k_all), case.v_all
    # expected: poison everywhere except the written slots
    exp_k, exp_v = _poisoned_pages(case.k_cache), _poisoned_pages(case.v_cache)
    kv_append_reference(k.to(DEV), v.to(DEV), case.slot_mapping.to(DEV), exp_k, exp_v)
    got_k, got_v = _poisoned_pages(case.k_cache), _poisoned_pages(case.v_cache)
    g = kv_append(k.to(DEV), v.to(DEV), case.slot_mapping.to(DEV), got_k, got_v,
                  guidance=cache_format == "nvfp4", variant=variant)
    torch.cuda.synchronize()
    _assert_pages_equal(got_k, exp_k)
    _assert_pages_equal(got_v, exp_v)
    if cache_format == "nvfp4":
        # the device pages equal the CPU reference's bytes, slot by slot
        flat = lambda t: t.flatten(0, 1)[case.slot_mapping.to(DEV)]  # noqa: E731
        assert torch.equal(kv_codes.decode_codes(flat(got_k.codes).cpu()), nvfp4.quantize(k).codes)
        for x, guide in ((k, g.k), (v, g.v)):
            ref = nvfp4.make_guidance(nvfp4.quantize(x))
            assert torch.equal(guide.mantissa_bits.cpu(), ref.mantissa_bits)
            assert torch.equal(_bytes(guide.block_scales).cpu(), _bytes(ref.block_scales))
            assert torch.equal(guide.scale.cpu().view(torch.int32), ref.scale.view(torch.int32))


@pytest.mark.parametrize("variant", [None, "b2_cta128_mb12"])
def test_kv_append_nonfinite_sets_status_and_skips_rows(variant):
    from trace_kernels.ops import raise_on_nonfinite
    case = kv_testing.make_case([40], 2, 2, 64, 16, "nvfp4", seed=3, fill=False)
    k = case.k_all.clone()
    k[7, 1, 9] = float("inf")
    pages_k, pages_v = _poisoned_pages(case.k_cache), _poisoned_pages(case.v_cache)
    kv_append(k.to(DEV), case.v_all.to(DEV), case.slot_mapping.to(DEV), pages_k, pages_v, check_values=False,
              variant=variant)
    with pytest.raises(ValueError, match="non-finite"):
        raise_on_nonfinite(torch.device(DEV, torch.cuda.current_device()))
    slot = int(case.slot_mapping[7])
    assert (pages_k.codes.flatten(0, 1)[slot, 1] == 0xFF).all()  # that row was not written
    with pytest.raises(ValueError, match="non-finite"):  # with value checks: raised before the launch
        kv_append(k.to(DEV), case.v_all.to(DEV), case.slot_mapping.to(DEV), pages_k, pages_v)


DECODE_CASES = [  # lengths, Hq, Hkv, D, P
    ([1, 17, 200, 64], 8, 8, 64, 16),        # GQA 1
    ([64, 3, 129, 1000], 16, 4, 128, 16),    # GQA 4
    ([300, 1, 65, 4097], 32, 4, 128, 64),    # GQA 8
    ([1000, 48, 2], 8, 1, 64, 64),           # GQA 8, D 64
    ([513, 20], 64, 4, 128, 16),             # GQA 16: two CTAs per kv head
    ([20000, 7, 3333], 32, 4, 128, 16),      # long
    ([900, 1, 77], 10, 2, 128, 16),          # GQA 5 (Llama 4): 5 MMA columns
    ([2500, 40], 24, 2, 64, 64),             # GQA 12 (GLM-4.5): mma 12 rows, mma2 / mma4l 2 CTAs of 6
]


@functools.lru_cache(maxsize=4)
def _cpu_case(cache_format, lengths, hq, hkv, d, p):
    return kv_testing.make_case(list(lengths), hq, hkv, d, p, cache_format, seed=hq * d + p + len(lengths))


def _decode_case(cache_format, lengths, hq, hkv, d, p):
    case = _cpu_case(cache_format, tuple(lengths), hq, hkv, d, p)
    k_dev, v_dev = kv_testing.pages_to(case.k_cache, DEV), kv_testing.pages_to(case.v_cache, DEV)
    return case, k_dev, v_dev


# (None: the launch default, attention.default_variant: mma4l, or mma4l_w1s2_c16 at the GQA 16 and 12 cases)
KERNELS = [("nvfp4", "mma2_w2s2"), ("nvfp4", "mma4l"), ("nvfp4", None), ("bf16", "mma")]
NVFP4_VARIANTS = ["mma2_w2s2", "mma4l"]
# other occupancy configurations: mma2 (one kv head per CTA) and mma4l (whole pages per CTA)
SWEEP_VARIANTS = decode_attention_codegen.CONFIG_TEST_VARIANTS


@pytest.mark.parametrize("num_splits", [None, 1, 3])
@pytest.mark.parametrize("cache_format,variant", KERNELS)
@pytest.mark.parametrize("lengths,hq,hkv,d,p", DECODE_CASES)
def test_decode_attention_matches_reference(cache_format, variant, lengths, hq, hkv, d, p, num_splits):
    case, k_dev, v_dev = _decode_case(cache_format, lengths, hq, hkv, d, p)
    q, table, lens = case.q.to(DEV), case.block_table.to(DEV), case.lengths.to(DEV)
    out = attention.decode_attention(q, k_dev, v_dev, table, lens, num_splits=num_splits, variant=variant)
    ref = attention.decode_attention_reference(q, k_dev, v_dev, table, lens).float()
    out = out.float()
    _assert_within_decode_bound(out, ref, 2e-3 * (4 if (cache_format, variant) == ("bf16", "mma") else 1))
    rel = float((out - ref).norm() / ref.norm())
    assert rel < (6e-3 if (cache_format, variant) == ("bf16", "mma") else 3e-3), rel


@pytest.mark.parametrize("variant", NVFP4_VARIANTS)
def test_decode_attention_vs_naive_fp64_and_softmax_scale(variant):
    case, k_dev, v_dev = _decode_case("nvfp4", [2500, 1, 77], 32, 4, 128, 16)
    out = attention.decode_attention(case.q.to(DEV), k_dev, v_dev, case.block_table.to(DEV), case.lengths.to(DEV),
                                     softmax_scale=0.05, variant=variant)
    ref = kv_testing.naive_attention_fp64(case, softmax_scale=0.05)
    rel = float((out.cpu().double() - ref).norm() / ref.norm())
    assert rel < 3e-3, rel


def _assert_within_decode_bound(out: torch.Tensor, ref: torch.Tensor, slack: float = 2e-3,
                                what: str = "") -> torch.Tensor:
    """out finite and within 2^-7 of ref per element plus `slack` of its row's largest |ref|; returns the bound.
    FP32 in both, different summation order, each then rounded to BF16 (one ulp = 2^-8 relative); the softmax
    weights enter the P.V product in FP16 (NVFP4 pages, 2^-11) / BF16 (2^-8) each."""
    assert torch.isfinite(out).all(), what
    err = (out - ref).abs()
    bound = ref.abs() * 2**-7 + slack * ref.abs().amax(dim=-1, keepdim=True)
    assert (err <= bound).all(), f"{what} max err {float(err.max())}, {int((err > bound).sum())} elements out of bound"
    return bound


@functools.lru_cache(maxsize=1)
def _growing_scores_case(lengths, hq, hkv, d, p, seed):
    """K magnitudes grow ~200x along each sequence, so a tile's max score often exceeds the running
    max by far more than 2^8 (the rescale path of every variant, mma4l's lazy one included), plus
    special rows: zero K and V rows, a V row scaled by 1e-30, one by 1e6, a K row scaled by 1e-30."""
    lengths = list(lengths)
    case = kv_testing.make_case(lengths, hq, hkv, d, p, "nvfp4", seed=seed, fill=False)
    g = torch.Generator().manual_seed(seed + 1)
    for i, n in enumerate(lengths):
        growth = torch.exp(torch.linspace(-2.5, 2.8, n))[:, None, None]  # [n, 1, 1]
        k = (torch.randn(n, hkv, d, generator=g) * growth).to(torch.bfloat16)
        v = kv_testing.random_rows(n, hkv, d, g)
        for row, (kf, vf) in zip((n // 3, n // 2, (2 * n) // 3, n - 1), ((0.0, 0.0), (1.0, 1e-30), (1e-30, 1e6),
                                                                       (1.0, 1.0))):
            k[row] = (k[row].float() * kf).to(torch.bfloat16)
            v[row] = (v[row].float() * vf).to(torch.bfloat16)
        case.k[i], case.v[i] = k, v
    from trace_kernels.kv_append import kv_append_reference
    kv_append_reference(case.k_all, case.v_all, case.slot_mapping, case.k_cache, case.v_cache)
    return case


@pytest.mark.parametrize("num_splits", [None, 1])
@pytest.mark.parametrize("variant", NVFP4_VARIANTS)
def test_decode_attention_growing_scores_and_special_rows(variant, num_splits):
    case = _growing_scores_case((3000, 700, 5, 129), 32, 4, 128, 16, seed=11)
    k_dev, v_dev = kv_testing.pages_to(case.k_cache, DEV), kv_testing.pages_to(case.v_cache, DEV)
    q, table, lens = case.q.to(DEV), case.block_table.to(DEV), case.lengths.to(DEV)
    out = attention.decode_attention(q, k_dev, v_dev, table, lens, num_splits=num_splits, variant=variant).float()
    ref = attention.decode_attention_reference(q, k_dev, v_dev, table, lens).float()
    _assert_within_decode_bound(out, ref)


SWEEP_CASES = [  # lengths, Hq, Hkv, D, P: one per CONFIG_TEST_SHAPES
    ([20000, 7, 3333], 32, 4, 128, 16),      # long, GQA 8 (the benchmark's shape)
    ([513, 20], 64, 4, 128, 16),             # GQA 16: two CTAs per kv head
    ([1000, 48, 2], 8, 1, 64, 64),           # GQA 8, D 64
]


@pytest.mark.parametrize("num_splits", [None, 3])
@pytest.mark.parametrize("lengths,hq,hkv,d,p", SWEEP_CASES)
@pytest.mark.parametrize("variant", SWEEP_VARIANTS)
def test_sweep_config_matches_reference(variant, lengths, hq, hkv, d, p, num_splits):
    """The occupancy configurations of mma2 / mma4l (warps, stages) compute what the defaults do."""
    case, k_dev, v_dev = _decode_case("nvfp4", lengths, hq, hkv, d, p)
    q, table, lens = case.q.to(DEV), case.block_table.to(DEV), case.lengths.to(DEV)
    out = attention.decode_attention(q, k_dev, v_dev, table, lens, num_splits=num_splits, variant=variant).float()
    ref = attention.decode_attention_reference(q, k_dev, v_dev, table, lens).float()
    _assert_within_decode_bound(out, ref)
    assert float((out - ref).norm() / ref.norm()) < 3e-3


@pytest.mark.parametrize("variant", SWEEP_VARIANTS)
def test_sweep_config_growing_scores(variant):
    """The rescale paths (mma2's eager one and mma4l's lazy one) at each configuration's tile size."""
    case = _growing_scores_case((3000, 700, 5, 129), 32, 4, 128, 16, seed=11)
    k_dev, v_dev = kv_testing.pages_to(case.k_cache, DEV), kv_testing.pages_to(case.v_cache, DEV)
    q, table, lens = case.q.to(DEV), case.block_table.to(DEV), case.lengths.to(DEV)
    out = attention.decode_attention(q, k_dev, v_dev, table, lens, variant=variant).float()
    ref = attention.decode_attention_reference(q, k_dev, v_dev, table, lens).float()
    _assert_within_decode_bound(out, ref)


WIDE_VARIANTS = decode_attention_codegen.WIDE_TEST_VARIANTS
WIDE_CASES = [  # lengths, Hq, Hkv, D, P: one per WIDE_TEST_SHAPES
    ([513, 20, 3000, 1], 64, 4, 128, 16),   # GQA 16 (Qwen3-235B-A22B): both column blocks full
    ([900, 1, 77], 96, 8, 128, 16),         # GQA 12 at D 128: the second block 4 of 8 columns
    ([2500, 40], 24, 2, 64, 64),            # GQA 12 at D 64, 64-token pages
]


@pytest.mark.parametrize("num_splits", [None, 1, 3])
@pytest.mark.parametrize("lengths,hq,hkv,d,p", WIDE_CASES)
@pytest.mark.parametrize("variant", WIDE_VARIANTS)
def test_wide_variant_matches_reference(variant, lengths, hq, hkv, d, p, num_splits):
    """mma4l_c16 (a GQA group of 9-16 q heads per kv head in one CTA, two MMA column blocks) against the reference,
    with the bounds of the other NVFP4 kernels, and against mma4l (two CTAs per kv head) within the same bounds."""
    case, k_dev, v_dev = _decode_case("nvfp4", lengths, hq, hkv, d, p)
    q, table, lens = case.q.to(DEV), case.block_table.to(DEV), case.lengths.to(DEV)
    out = attention.decode_attention(q, k_dev, v_dev, table, lens, num_splits=num_splits, variant=variant).float()
    ref = attention.decode_attention_reference(q, k_dev, v_dev, table, lens).float()
    bound = _assert_within_decode_bound(out, ref)
    assert float((out - ref).norm() / ref.norm()) < 3e-3
    narrow = attention.decode_attention(q, k_dev, v_dev, table, lens, num_splits=num_splits, variant="mma4l").float()
    assert ((out - narrow).abs() <= 2 * bound).all()


@pytest.mark.parametrize("variant", WIDE_VARIANTS)
def test_wide_variant_growing_scores_and_special_rows(variant):
    """The lazy rescale of two column blocks (a warp rescales when any of its 16 columns grew) and special rows."""
    case = _growing_scores_case((3000, 700, 5, 129), 64, 4, 128, 16, seed=11)
    k_dev, v_dev = kv_testing.pages_to(case.k_cache, DEV), kv_testing.pages_to(case.v_cache, DEV)
    q, table, lens = case.q.to(DEV), case.block_table.to(DEV), case.lengths.to(DEV)
    for num_splits in (None, 1):
        out = attention.decode_attention(q, k_dev, v_dev, table, lens, num_splits=num_splits, variant=variant).float()
        ref = attention.decode_attention_reference(q, k_dev, v_dev, table, lens).float()
        _assert_within_decode_bound(out, ref, what=f"num_splits={num_splits}")


@pytest.mark.parametrize("num_splits", [None, 3])
@pytest.mark.parametrize("variant,lengths,hq,hkv,d,p", [
    *((v, *case) for v in ("mma2_w2s2", "mma4l", "mma4l_w1s2", "mma4l_w4s2")
      for case in (([70, 1, 1000, 33], 32, 4, 128, 16), ([100, 5, 31], 8, 1, 64, 64))),
    ("mma4l_c16", [70, 1, 1000, 33], 64, 4, 128, 16), ("mma4l_c16", [100, 5, 31], 24, 2, 64, 64)])
def test_decode_ignores_bytes_past_the_end(variant, lengths, hq, hkv, d, p, num_splits):
    """Slots past a sequence's end hold 0xFF (NaN block and row scales) and the block table past its
    pages holds ids far outside the cache: no variant may read a wrong page or let those bytes reach
    the output (mma4l copies whole pages, so the tail of a sequence's last page is in shared memory)."""
    case, k_dev, v_dev = _decode_case("nvfp4", lengths, hq, hkv, d, p)
    q, table, lens = case.q.to(DEV), case.block_table.to(DEV), case.lengths.to(DEV)
    ref = attention.decode_attention_reference(q, k_dev, v_dev, table, lens).float()
    used = torch.zeros(k_dev.codes.shape[0] * p, dtype=torch.bool)
    used[case.slot_mapping] = True
    dirty_k, dirty_v = kv_testing.pages_to(k_dev, DEV), kv_testing.pages_to(v_dev, DEV)
    for pages in (dirty_k, dirty_v):
        for t in kv_cache.page_tensors(pages):
            flat = t.view(torch.uint8).view(used.numel(), -1)  # [slots, bytes of a slot]
            flat[~used.to(DEV)] = 0xFF
    assert int((table.cpu() == kv_testing.UNUSED_PAGE).sum()) > 0  # ids past the pages: never read
    out = attention.decode_attention(q, dirty_k, dirty_v, table, lens, num_splits=num_splits, variant=variant,
                                     check_values=False).float()
    _assert_within_decode_bound(out, ref)


@pytest.mark.parametrize("variant", [None, "mma2_w2s2"])
def test_decode_attention_cuda_graph(variant):
    case, k_dev, v_dev = _decode_case("nvfp4", [100, 900], 32, 4, 128, 16)
    q, table, lens = case.q.to(DEV), case.block_table.to(DEV), case.lengths.to(DEV)
    ref = attention.decode_attention(q, k_dev, v_dev, table, lens, variant=variant)
    graph = torch.cuda.CUDAGraph()
    attention.decode_attention(q, k_dev, v_dev, table, lens, check_values=False, variant=variant)  # warm up
    with capture_graph(graph):
        out = attention.decode_attention(q, k_dev, v_dev, table, lens, check_values=False, variant=variant)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ref)  # deterministic: same plan, same order


def test_decode_rejects_bad_input_on_gpu():
    case, k_dev, v_dev = _decode_case("nvfp4", [30, 40], 8, 2, 64, 16)
    q, table, lens = case.q.to(DEV), case.block_table.to(DEV), case.lengths.to(DEV)
    with pytest.raises(ValueError, match="lengths"):
        attention.decode_attention(q, k_dev, v_dev, table, lens * 100)
    with pytest.raises(ValueError, match="is on"):
        attention.decode_attention(q.cpu(), k_dev, v_dev, table, lens)
    with pytest.raises(ValueError, match="contiguous"):
        attention.decode_attention(q.transpose(0, 1).contiguous().transpose(0, 1), k_dev, v_dev, table, lens)


GATHER_CASES = [  # lengths, Hkv, D, P
    ([1, 33, 250], 2, 64, 16),
    ([700, 5], 4, 128, 64),
    ([20000, 7, 3333], 4, 128, 16),  # long, and a table much wider than two of its sequences
    ([17, 64], 8, 128, 16),
    ([300, 7], 2, 256, 16),  # head_dim 256 (Qwen3-Next's full-attention layers: 2 kv heads)
]


@pytest.mark.parametrize("items", [1, 2, 4])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("lengths,hkv,d,p", GATHER_CASES, ids=["short", "p64", "long", "hkv8", "d256"])
def test_kv_gather_bit_exact(lengths, hkv, d, p, dtype, items):
    case = kv_testing.make_case(lengths, 8, hkv, d, p, "nvfp4", seed=sum(lengths) + d + hkv, fill=False)
    k = _special_rows(case.k_all)  # zero rows and blocks, E4M3-subnormal block scales, a tiny row
    kv_append_reference(k, case.v_all, case.slot_mapping, case.k_cache, case.v_cache)
    want = kv_gather_reference(case.k_cache, case.v_cache, case.block_table, case.lengths,
                               case.block_table.shape[1] * p, dtype)  # CPU; unused table entries never read
    k_dev, v_dev = kv_testing.pages_to(case.k_cache, DEV), kv_testing.pages_to(case.v_cache, DEV)
    got = kv_gather(k_dev, v_dev, case.block_table.to(DEV), case.lengths.to(DEV), dtype=dtype, items=items)
    torch.cuda.synchronize()
    for g, w in zip(got, want):
        assert g.dtype == dtype and g.shape == w.shape
        assert torch.equal(_bytes(g).cpu(), _bytes(w))  # poisoned outputs: every byte written, zeros past the end


def test_kv_gather_part_of_the_table_and_engine_style_lengths():
    case = kv_testing.make_case([100, 37], 8, 4, 128, 16, "nvfp4", seed=21, extra_table_pages=0)
    k_dev, v_dev = kv_testing.pages_to(case.k_cache, DEV), kv_testing.pages_to(case.v_cache, DEV)
    table = case.block_table.clone()
    table[table == kv_testing.UNUSED_PAGE] = 0  # the engine pads with its scratch page 0 and reads it all
    full = torch.full_like(case.lengths, table.shape[1] * 16)
    for lengths, positions in ((case.lengths, 50), (full, None)):
        want = kv_gather_reference(case.k_cache, case.v_cache, table, lengths, positions or table.shape[1] * 16)
        got = kv_gather(k_dev, v_dev, table.to(DEV), lengths.to(DEV), positions)
        for g, w in zip(got, want):
            assert torch.equal(_bytes(g).cpu(), _bytes(w))


def test_kv_gather_cuda_graph():
    case = kv_testing.make_case([300, 9], 8, 4, 128, 16, "nvfp4", seed=22)
    k_dev, v_dev = kv_testing.pages_to(case.k_cache, DEV), kv_testing.pages_to(case.v_cache, DEV)
    table, lens = case.block_table.to(DEV), case.lengths.to(DEV)
    ref = kv_gather(k_dev, v_dev, table, lens)
    graph = torch.cuda.CUDAGraph()
    with capture_graph(graph):
        out = kv_gather(k_dev, v_dev, table, lens, check_values=False)
    for t in out:
        t.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(_bytes(o), _bytes(r)) for o, r in zip(out, ref))


def test_kv_gather_rejects_bad_input_on_gpu():
    case, k_dev, v_dev = _decode_case("nvfp4", [30, 40], 8, 2, 64, 16)
    table, lens = case.block_table.to(DEV), case.lengths.to(DEV)
    with pytest.raises(ValueError, match="is on"):
        kv_gather(k_dev, v_dev, table.cpu(), lens)
    with pytest.raises(ValueError, match="lengths"):
        kv_gather(k_dev, v_dev, table, lens * 100)
    odd = kv_cache.NVFP4Pages(k_dev.codes.transpose(0, 1).contiguous().transpose(0, 1), k_dev.block_scales,
                              k_dev.scale)
    with pytest.raises(ValueError, match="contiguous"):
        kv_gather(odd, v_dev, table, lens)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("lengths,hq,hkv,d", [([300, 1, 65, 1000], 32, 4, 128), ([300, 40], 16, 2, 256)])
def test_extend_attention_on_gathered_pages_equals_reference_gather(monkeypatch, dtype, lengths, hq, hkv, d):
    case, k_dev, v_dev = _decode_case("nvfp4", lengths, hq, hkv, d, 16)
    table, lens = case.block_table.to(DEV), case.lengths.to(DEV)
    q = torch.randn(len(lengths), 5, hq, d, generator=torch.Generator().manual_seed(23)).to(DEV, dtype)
    out = attention.extend_attention(q, k_dev, v_dev, table, lens)
    # the same SDPA over the reference gather (torch ops on the GPU): only masked positions differ
    monkeypatch.setattr(attention, "kv_gather", lambda k, v, t, n, dtype, check_values: kv_gather_reference(
        k, v, t, n, t.shape[1] * 16, dtype))
    ref = attention.extend_attention(q, k_dev, v_dev, table, lens)
    assert torch.equal(out, ref)
