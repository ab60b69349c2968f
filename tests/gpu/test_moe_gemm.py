"""GPU tests of the NVFP4 MoE grouped GEMM kernels against the reference (sm_90a, marked gpu)."""

import dataclasses
import itertools
import os

import pytest
import torch

from trace_kernels import moe_gemm as ops
from trace_kernels import moe_gemm_ref as ref
from trace_kernels import nvfp4
from trace_kernels.codegen.ops.moe_gemm import DEFAULT_VARIANT, EXTRA_TILES, TILE_TABLE, WS_TILE_TABLE, tile_for_rows
from trace_kernels.moe_routing import route, token_tile_bound, token_tiles
from trace_kernels.moe_slot_rows import SlotRows, decode_slot_rows, empty_slot_rows
from trace_kernels.moe_testing import ODD_CHUNKS_SHAPE, make_problem, make_weights, random_topk
from trace_kernels.ops import _common
from trace_kernels.runtime import capture_graph

pytestmark = pytest.mark.gpu

# both variants' table tiles plus the off-table tilings profiling/moe_prebuild.py builds (EXTRA_TILES);
# test_batch_invariance compares all of them bitwise, so the ws variant must equal v1 bit for bit
# (TRACE_KERNELS_MOE_TEST_VARIANTS=v1 limits them to one variant, e.g. after a ws kernel hung)
_VARIANTS = os.environ.get("TRACE_KERNELS_MOE_TEST_VARIANTS", "v1,ws").split(",")
TILES = [tile for tile in [t for _, t in TILE_TABLE] + [t for _, t in WS_TILE_TABLE] + list(EXTRA_TILES)
         if tile.variant in _VARIANTS]
WS_TILES = [tile for tile in TILES if tile.variant == "ws"]
SHAPES = {"tiny": (8, 256, 128, 2), "qwen3-30b-a3b": (128, 2048, 768, 8)}


def _rel(got, want):
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm())


def _poisoned_gate_up(m, inter):
    out = ops.empty_gate_up_output(m, inter, "cuda")
    out.h.fill_(float("nan"))
    out.a_next.fill_(float("nan"))
    out.q.scale.fill_(float("nan"))
    out.q.codes.fill_(0xAB)
    out.q.block_scales.view(torch.uint8).fill_(0x7F)  # e4m3 NaN
    out.mantissa_bits.fill_(0xAB)
    return out


_WEIGHTS = {}


def weights_for(name):
    """One set of random NVFP4 weights per shape for the whole module (quantizing 128 experts takes a while)."""
    if name not in _WEIGHTS:
        e, h, i, _ = SHAPES[name]
        _WEIGHTS[name] = make_weights(e, h, i, seed=len(_WEIGHTS) + 1, device="cuda")
    return _WEIGHTS[name]


@pytest.fixture(scope="module", params=list(SHAPES))
def shape(request):
    return request.param, SHAPES[request.param]


def _pool_names():
    return {pool for device, pool in _common._counters if device == torch.cuda.current_device()}


def _row_amax_pool():
    """The fused epilogue's per-row amax buffer (moe_gemm._launch_gemm), which every launch leaves zero."""
    return _common._counters[(torch.cuda.current_device(), "gate_up_row_amax")]


def problem(name, tokens, seed, skew=0.0):
    e, h, i, k = SHAPES[name]
    return make_problem(e, h, i, k, tokens, seed=seed, device="cuda", skew=skew, weights=weights_for(name))


@pytest.mark.parametrize("tokens,skew", [(1, 0.0), (37, 0.0), (300, 3.0), (1024, 0.0), (4096, 1.0)])
@pytest.mark.parametrize("w4a4", [True, False])
def test_plain_matches_reference(shape, tokens, skew, w4a4):
    name, (e, h, i, k) = shape
    p = problem(name, tokens, tokens + 7 * int(w4a4), skew)
    a, s_a = (p.a, p.s_a) if w4a4 else (p.x, None)
    want = ref.moe_gemm_ref(a, p.gate_up, p.routing.offsets, row_index=p.routing.row_index, row_scale=s_a)
    for tile in TILES:
        out = torch.full_like(want, float("nan"))
        got = ops.moe_gemm(a, p.gate_up, p.routing.offsets, row_index=p.routing.row_index, row_scale=s_a,
                           tile=tile, out=out)
        torch.cuda.synchronize()
        assert not got.isnan().any(), f"{name} tile {tile}: unwritten outputs"
        assert _rel(got, want) <= 2e-3, (name, tile, _rel(got, want))


@pytest.mark.parametrize("tokens,skew", [(1, 0.0), (64, 0.0), (300, 3.0)])
def test_gate_up_fused_quantization_is_exact(shape, tokens, skew):
    name, (e, h, i, k) = shape
    p = problem(name, tokens, 100 + tokens, skew)
    want = ref.moe_gate_up_ref(p.a, p.gate_up, p.routing.offsets, row_index=p.routing.row_index, row_scale=p.s_a)
    m = p.routing.num_rows
    for tile in TILES:
        out = ops.moe_gate_up(p.a, p.gate_up, p.routing.offsets, row_index=p.routing.row_index, row_scale=p.s_a,
                              tile=tile, out=_poisoned_gate_up(m, i))
        torch.cuda.synchronize()
        assert _rel(out.h, want.h) <= 2e-3, (name, tile, _rel(out.h, want.h))
        # the kernel's quantization is exactly nvfp4.quantize of its own bf16 SwiGLU output
        own = ref.quantize_swiglu(out.h.cpu())
        assert torch.equal(out.q.codes.cpu(), own.q.codes), tile
        assert torch.equal(out.q.block_scales.view(torch.uint8).cpu(), own.q.block_scales.view(torch.uint8)), tile
        assert torch.equal(out.q.scale.cpu(), own.q.scale), tile
        assert torch.equal(out.a_next.cpu(), own.a_next), tile
        assert torch.equal(out.mantissa_bits.cpu(), own.mantissa_bits), tile
        agree = nvfp4.agreement(want.q.codes.cpu(), out.q.codes.cpu())["equal_fraction"]
        assert agree >= 0.999, (name, tile, agree)
        if tile.row_amax:  # its last CTA left the row amaxes zero for the next launch (other tiles have no pool)
            assert not _row_amax_pool().any(), tile


def test_gate_up_fused_quantization_of_extreme_rows():
    """Rows whose scale leaves the epilogue's branch-free range (zero rows: s = 0; tiny rows:
    s < 2^-40; huge rows: s > 2^37) take the checked block path, still exactly nvfp4.quantize."""
    p = problem("qwen3-30b-a3b", 300, 77)
    x = p.x.clone()  # [T, H] bf16, W4A16 (no activation row scale)
    x[0::7] = 0
    x[1::7] *= 2.0 ** -40  # h ~ x^2: s ~ 2^-80
    x[2::7] *= 2.0 ** 30  # s ~ 2^60
    r = p.routing
    m, i = r.num_rows, SHAPES["qwen3-30b-a3b"][2]
    for tile in TILES:
        out = ops.moe_gate_up(x, p.gate_up, r.offsets, row_index=r.row_index, tile=tile, out=_poisoned_gate_up(m, i))
        torch.cuda.synchronize()
        own = ref.quantize_swiglu(out.h.cpu())
        scales = out.q.scale.cpu()
        assert bool((scales == 0).any()) and bool((scales < 2.0 ** -40).any()) and bool((scales > 2.0 ** 37).any())
        assert torch.equal(out.q.codes.cpu(), own.q.codes), tile
        assert torch.equal(out.q.block_scales.view(torch.uint8).cpu(), own.q.block_scales.view(torch.uint8)), tile
        assert torch.equal(scales, own.q.scale), tile
        assert torch.equal(out.a_next.cpu(), own.a_next), tile
        assert torch.equal(out.mantissa_bits.cpu(), own.mantissa_bits), tile


def test_grid_at_its_bound_computes_every_tile():
    """Routings whose token tiles equal the grid's bound (moe_routing.token_tile_bound: every expert has rows, each
    1 mod TN of them), so the last CTA of the grid holds the last tile: every row computed, plain and fused."""
    e, h, i, _ = SHAPES["tiny"]
    gen = torch.Generator().manual_seed(5)
    for tile in TILES:
        tn = tile.tile_tokens
        rows = [1 + tn * (int(torch.randint(0, 3, (1,), generator=gen)) if j else 1) for j in range(e)]
        offsets = torch.tensor([0] + list(itertools.accumulate(rows)), dtype=torch.int32)
        m = int(offsets[-1])
        assert token_tiles(offsets, tn) == token_tile_bound(m, e, tn)
        p = problem("tiny", m, 300 + tn)  # [m, H] tokens; row r reads a random one
        offsets, row_index = offsets.cuda(), torch.randint(0, m, (m,), generator=gen, dtype=torch.int32).cuda()
        want = ref.moe_gemm_ref(p.a, p.gate_up, offsets, row_index=row_index, row_scale=p.s_a)
        got = ops.moe_gemm(p.a, p.gate_up, offsets, row_index=row_index, row_scale=p.s_a, tile=tile,
                           out=torch.full_like(want, float("nan")))
        fused = ops.moe_gate_up(p.a, p.gate_up, offsets, row_index=row_index, row_scale=p.s_a, tile=tile,
                                out=_poisoned_gate_up(m, i))
        torch.cuda.synchronize()
        assert not got.isnan().any() and _rel(got, want) <= 2e-3, (tile, _rel(got, want))
        own = ref.quantize_swiglu(fused.h.cpu())
        assert not fused.h.isnan().any() and torch.equal(fused.q.codes.cpu(), own.q.codes), tile
        assert torch.equal(fused.mantissa_bits.cpu(), own.mantissa_bits), tile


@pytest.mark.parametrize("tokens,skew", [(1, 0.0), (64, 0.0), (300, 3.0), (1024, 0.0)])
def test_down_combine_matches_reference(shape, tokens, skew):
    name, (e, h, i, k) = shape
    p = problem(name, tokens, 200 + tokens, skew)
    m = p.routing.num_rows
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    a = torch.randn(m, i, device="cuda", generator=gen).to(torch.bfloat16)  # sorted rows
    s_a = torch.rand(m, device="cuda", generator=gen) + 0.5
    want = ref.moe_down_ref(a, p.down, p.routing, row_scale=s_a)
    rows_want = ref._grouped_scaled_matmul(a, p.down, p.routing.offsets, None, s_a, torch.float64)
    rows_want = rows_want * p.routing.row_weight.double().unsqueeze(1)  # [M, H] exact per-slot rows
    for tile in TILES + [None]:  # None: what calls get (auto's down table: ws with two m-tiles in prefill)
        out = torch.full_like(want, float("nan"))
        ys = empty_slot_rows(m, h, "cuda")
        ys.values.fill_(float("nan"))
        ys.exponents.fill_(127)
        got = ops.moe_down(a, p.down, p.routing, row_scale=s_a, tile=tile, out=out, slot_workspace=ys)
        torch.cuda.synchronize()
        assert not got.isnan().any(), tile
        assert _rel(got, want) <= 2e-3, (name, tile, _rel(got, want))
        # the stored rows: FP32-accumulation close to the exact ones, each pair's larger value in [2^14, 2^15]
        assert _rel(decode_slot_rows(ys), rows_want) <= 5e-4, (name, tile)  # (FP16 rounding: ~2e-4)
        _assert_pairs_scaled(ys)
        assert torch.equal(ops.moe_combine(ys, p.routing.slot_rows), got), tile  # the combine alone: same bits


def _assert_pairs_scaled(ys: SlotRows):
    m, h = ys.values.shape
    amax = ys.values.float().abs().reshape(m, h // 2, 2).amax(-1)  # [M, H/2]: a pair's two values are adjacent
    assert ((amax >= 2 ** 14) & (amax <= 2 ** 15)).all()


@pytest.mark.parametrize("tokens,top_k,h", [(1, 8, 2048), (77, 8, 2048), (300, 4, 2048), (5, 1, 2048), (3, 8, 4096),
                                           (9, 4, 2880), (2, 8, 7168), (4, 2, 256)])
def test_combine_kernel_equals_reference(tokens, top_k, h):
    """moe_combine on fresh random per-slot rows (exponents over their whole range, subnormal FP16 values among
    them) gives the reference's bits; its output is poisoned first. Hidden sizes of one 16-column block per thread
    (2048: 128 threads, 4096: 256), a partly filled warp (2880: 180 blocks), two blocks per thread (7168) and fewer
    blocks than threads (256)."""
    m = tokens * top_k
    gen = torch.Generator(device="cuda").manual_seed(tokens * 10 + top_k)
    values = torch.randn(m, h, device="cuda", generator=gen) * 4.0 ** torch.randint(-12, 7, (m, h), device="cuda",
                                                                                     generator=gen)
    # (up to 100, not 113: sums that overflow could meet as inf - inf = NaN, which torch.equal never equals)
    exponents = torch.randint(-126, 101, (m, h // 2), device="cuda", generator=gen, dtype=torch.int32)
    ys = SlotRows(values.to(torch.float16), exponents.to(torch.int8))
    slot_rows = torch.randperm(m, device="cuda", generator=gen).to(torch.int32).reshape(tokens, top_k)
    want = ref.combine_slots(decode_slot_rows(SlotRows(ys.values.cpu(), ys.exponents.cpu())), slot_rows.cpu())
    got = torch.full((tokens, h), float("nan"), dtype=torch.bfloat16, device="cuda")
    ops._launch_combine(ys, slot_rows, got, pdl=False)
    assert torch.equal(got.cpu(), want)
    assert torch.equal(ops.moe_combine(ys, slot_rows).cpu(), want)
    with pytest.raises(ValueError, match="slot_rows values"):
        ops.moe_combine(ys, slot_rows + m)
    with pytest.raises(ValueError, match="exponents"):
        ops.moe_combine(SlotRows(ys.values, ys.exponents[:, :-1]), slot_rows)


def _pipeline(x, ids, weights, p, tile):
    """W4A4 gate_up (fused) -> down (combine) for tokens x [T, H]; returns (h, codes, y) in slot order."""
    routing = route(ids, p.gate_up.num_experts, weights)
    a, s_a = ref.quantize_activations(x)
    up = ops.moe_gate_up(a, p.gate_up, routing.offsets, row_index=routing.row_index, row_scale=s_a, tile=tile)
    y = ops.moe_down(up.a_next, p.down, routing, row_scale=up.q.scale, tile=tile)
    slots = routing.slot_rows.long()  # [T, k]
    return up.h[slots], up.q.codes[slots], y


@pytest.mark.parametrize("name", ["qwen3-30b-a3b"])
def test_batch_invariance(name):
    """A token's outputs are bitwise identical for batch sizes 1/64/4096 and every tile choice."""
    e, h, i, k = SHAPES[name]
    p = problem(name, 1, 3)
    gen = torch.Generator().manual_seed(11)
    probe_x = torch.randn(1, h, generator=gen).to("cuda", torch.bfloat16)
    probe_ids = random_topk(1, e, k, gen).to("cuda")
    probe_w = torch.softmax(torch.randn(1, k, generator=gen), 1).to("cuda")
    baseline = None
    for batch in (1, 64, 4096):
        x = torch.randn(batch, h, generator=gen).to("cuda", torch.bfloat16)
        ids = random_topk(batch, e, k, gen, skew=2.0).to("cuda")
        w = torch.softmax(torch.randn(batch, k, generator=gen), 1).to("cuda")
        pos = int(torch.randint(0, batch, (1,), generator=gen))
        x[pos], ids[pos], w[pos] = probe_x[0], probe_ids[0], probe_w[0]
        for tile in [None, *TILES]:
            hh, codes, y = _pipeline(x, ids, w, p, tile)
            got = (hh[pos], codes[pos], y[pos])
            if baseline is None:
                baseline = got
                continue
            for g, b, what in zip(got, baseline, ("h", "codes", "y")):
                assert torch.equal(g, b), f"{what} differs at batch {batch}, tile {tile}"


@pytest.mark.skipif(DEFAULT_VARIANT != "auto", reason="tuned tables serve auto's calls only (TRACE_KERNELS_MOE_VARIANT)")
@pytest.mark.parametrize("tokens", [2, 300])
def test_tuned_tables_run_their_tiles_and_keep_the_bits(tokens, tmp_path):
    """A tuned tables file (trace_kernels.moe_tables) for the tiny shape: a call without tile= runs its tiles, and the
    layer's h, codes and output equal auto's bit for bit (every tile sums each output in the same K order)."""
    from trace_kernels import moe_tables
    from trace_kernels.codegen.ops.moe_gemm import TileConfig
    e, h, i, k = SHAPES["tiny"]
    ws, tn32 = WS_TILE_TABLE[0][1], TileConfig(32, 3, chunks_per_stage=2)
    path = tmp_path / "tables.json"
    moe_tables.write(path, [moe_tables.entry("gate_up_swiglu", e, 2 * i, h, [(1.0, ws), (float("inf"), tn32)]),
                            moe_tables.entry("down_routed", e, h, i, [(float("inf"), tn32)])], {"test": True})
    p = problem("tiny", tokens, seed=tokens)
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, h, generator=gen).to("cuda", torch.bfloat16)
    ids = random_topk(tokens, e, k, gen).to("cuda")
    w = torch.softmax(torch.randn(tokens, k, generator=gen), 1).to("cuda")
    want = _pipeline(x, ids, w, p, None)
    moe_tables.register(path)
    try:
        tuned_tile = tile_for_rows(tokens * k, e, k=h, kind="gate_up_swiglu", n=2 * i)
        assert tuned_tile == (ws if tokens * k <= e else tn32)
        assert tile_for_rows(tokens * k, e, k=i, kind="down_routed", n=h) == tn32
        got = _pipeline(x, ids, w, p, None)
    finally:
        moe_tables.clear()
    for g, b, what in zip(got, want, ("h", "codes", "y")):
        assert torch.equal(g, b), what


@pytest.mark.parametrize("tokens,top_k", [(1, 2), (8, 2), (64, 2), (300, 2), (2048, 2), (1, 1)])
def test_auto_tiles_at_odd_chunk_counts(tokens, top_k):
    """What a call without tile= launches at a shape outside the presets whose K chunks are odd in number
    (moe_testing.ODD_CHUNKS_SHAPE): the plain GEMM, the fused gate_up (its quantization exactly nvfp4.quantize of its
    own h) and the down GEMM with the combine, against the reference. At top-1, T=1 (1/8 routed row per expert) auto's
    rows are the ws tiles, whose stages K = 576 and 320 do not divide: the fallback's v1 ring runs (row_amax)."""
    s = ODD_CHUNKS_SHAPE
    e, h, i, k = s.experts, s.hidden, s.intermediate, top_k
    if top_k == 1:
        fused = tile_for_rows(tokens, e, k=h, kind="gate_up_swiglu", n=2 * i)
        assert fused.variant == "v1" and fused.row_amax, fused
    p = make_problem(e, h, i, k, tokens, seed=tokens, device="cuda", skew=1.0 if tokens == 300 else 0.0)
    r = p.routing
    want = ref.moe_gemm_ref(p.a, p.gate_up, r.offsets, row_index=r.row_index, row_scale=p.s_a)
    got = ops.moe_gemm(p.a, p.gate_up, r.offsets, row_index=r.row_index, row_scale=p.s_a,
                       out=torch.full_like(want, float("nan")))
    torch.cuda.synchronize()
    assert not got.isnan().any() and _rel(got, want) <= 2e-3, _rel(got, want)
    up_want = ref.moe_gate_up_ref(p.a, p.gate_up, r.offsets, row_index=r.row_index, row_scale=p.s_a)
    up = ops.moe_gate_up(p.a, p.gate_up, r.offsets, row_index=r.row_index, row_scale=p.s_a,
                         out=_poisoned_gate_up(r.num_rows, i))
    torch.cuda.synchronize()
    assert _rel(up.h, up_want.h) <= 2e-3, _rel(up.h, up_want.h)
    if top_k == 1:  # the row_amax launch leaves its amax buffer zero
        assert not _row_amax_pool().any()
    own = ref.quantize_swiglu(up.h.cpu())
    assert torch.equal(up.q.codes.cpu(), own.q.codes) and torch.equal(up.q.scale.cpu(), own.q.scale)
    assert torch.equal(up.a_next.cpu(), own.a_next) and torch.equal(up.mantissa_bits.cpu(), own.mantissa_bits)
    y_want = ref.moe_down_ref(up.a_next, p.down, r, row_scale=up.q.scale)
    y = ops.moe_down(up.a_next, p.down, r, row_scale=up.q.scale, out=torch.full_like(y_want, float("nan")))
    torch.cuda.synchronize()
    assert not y.isnan().any() and _rel(y, y_want) <= 2e-3, _rel(y, y_want)


def _layer_tile(variant, m, e):
    """A test layer's tile: the variant's table tile, or for "v1_cb" v1's with the down GEMM's combine in its
    epilogue (fused_combine; the gate_up kernels ignore it), for "v1_pf" v1's prefetching its weights into L2 ahead of
    the PDL wait (l2_prefetch, both GEMMs)."""
    if variant == "v1_cb":
        return dataclasses.replace(tile_for_rows(m, e, "v1"), fused_combine=True)
    if variant == "v1_pf":
        return dataclasses.replace(tile_for_rows(m, e, "v1"), l2_prefetch=True)
    return tile_for_rows(m, e, variant)


def _captured_layer(p, tokens, up_tile, down_tile):
    """The 30B layer on p's routing captured in a CUDA graph (validate=False: no host syncs) after one eager warm-up,
    which builds, loads and allocates the tile counters and amax buffers; returns the graph and its input and output
    buffers (x, s_a, up_out, y)."""
    _, h, i, _ = SHAPES["qwen3-30b-a3b"]
    r = p.routing
    x, s_a = p.a.clone(), p.s_a.clone()
    up_out = ops.empty_gate_up_output(r.num_rows, i, "cuda")
    y = torch.empty(tokens, h, dtype=torch.bfloat16, device="cuda")

    def layer():
        up = ops.moe_gate_up(x, p.gate_up, r.offsets, row_index=r.row_index, row_scale=s_a, validate=False,
                             out=up_out, tile=up_tile)
        ops.moe_down(up.a_next, p.down, r, row_scale=up.q.scale, validate=False, out=y, tile=down_tile)

    layer()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with capture_graph(graph):
        layer()
    return graph, x, s_a, up_out, y


@pytest.mark.parametrize("variant", [*_VARIANTS, "auto_qa", "auto_ov", "v1_cb", "v1_pf"])
def test_cuda_graph_replay_matches_eager(variant):
    """The layer captured in a CUDA graph (validate=False: no host syncs) replays to the eager result,
    also on new inputs copied into the captured buffers (the fused epilogue's tile counters reset)."""
    p = problem("qwen3-30b-a3b", 64, 21)
    r = p.routing
    tile = _layer_tile(variant, r.num_rows, p.gate_up.num_experts)
    graph, x, s_a, _, y = _captured_layer(p, 64, tile, tile)
    for seed in (1, 2):
        fresh = problem("qwen3-30b-a3b", 64, 21 + seed)
        x.copy_(fresh.a)
        s_a.copy_(fresh.s_a)
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        replayed = y.clone()
        up = ops.moe_gate_up(fresh.a, p.gate_up, r.offsets, row_index=r.row_index, row_scale=fresh.s_a, tile=tile)
        eager = ops.moe_down(up.a_next, p.down, r, row_scale=up.q.scale, tile=tile)  # same routing r as captured
        assert torch.equal(replayed, eager)


def _replay_on(graph, fresh, x, s_a, up_out, y):
    """A captured layer's replay on fresh's activations (copied into its input buffers x, s_a), its outputs y and
    up_out's codes poisoned first."""
    x.copy_(fresh.a)
    s_a.copy_(fresh.s_a)
    y.fill_(float("nan"))
    up_out.q.codes.fill_(0xFF)
    graph.replay()
    torch.cuda.synchronize()


def test_row_amax_layer_replays_auto_bits():
    """auto's ws gate_up tile at T <= 2 (folding each row's amax in every CTA, TileConfig.row_amax) captured in a CUDA
    graph and replayed on new inputs: the layer's h, codes and output equal the eager bits of auto_ra0's tile (a warp
    per row's amax) each time, and the amax buffer is left zero between launches."""
    _, h, i, _ = SHAPES["qwen3-30b-a3b"]
    p = problem("qwen3-30b-a3b", 2, 41)
    r = p.routing
    tile = tile_for_rows(r.num_rows, p.gate_up.num_experts, "auto", k=h, kind="gate_up_swiglu", n=2 * i)
    reduced = tile_for_rows(r.num_rows, p.gate_up.num_experts, "auto_ra0", k=h, kind="gate_up_swiglu", n=2 * i)
    assert tile.row_amax and tile.variant == "ws" and not reduced.row_amax
    graph, x, s_a, up_out, y = _captured_layer(p, 2, tile, None)
    for seed in (1, 2, 3):
        fresh = problem("qwen3-30b-a3b", 2, 41 + seed)
        _replay_on(graph, fresh, x, s_a, up_out, y)
        assert not _row_amax_pool().any()
        want = ops.moe_gate_up(fresh.a, p.gate_up, r.offsets, row_index=r.row_index, row_scale=fresh.s_a, tile=reduced)
        want_y = ops.moe_down(want.a_next, p.down, r, row_scale=want.q.scale)
        assert torch.equal(up_out.h, want.h) and torch.equal(up_out.q.codes, want.q.codes)
        assert torch.equal(up_out.mantissa_bits, want.mantissa_bits) and torch.equal(y, want_y)


@pytest.mark.parametrize("variant", ["auto_ra0", "auto_qk"])
@pytest.mark.parametrize("tokens", [1, 2, 8, 64, 300, 2048])
def test_row_amax_tables_give_auto_bits(variant, tokens):
    """The A/B tables' fused gate_up (auto_ra0: auto's ws tile at T <= 2 without row_amax; auto_qk: every tile
    quantizing in its own last CTA, v1's TN=8 to 128 rings too) gives auto's h, codes, scales and guidance bit for
    bit."""
    name = "qwen3-30b-a3b"
    e, h, i, k = SHAPES[name]
    p = problem(name, tokens, 700 + tokens, skew=1.0 if tokens == 300 else 0.0)
    r = p.routing
    tile = tile_for_rows(r.num_rows, e, variant, k=h, kind="gate_up_swiglu", n=2 * i)
    got = ops.moe_gate_up(p.a, p.gate_up, r.offsets, row_index=r.row_index, row_scale=p.s_a, tile=tile,
                          out=_poisoned_gate_up(r.num_rows, i))
    want = ops.moe_gate_up(p.a, p.gate_up, r.offsets, row_index=r.row_index, row_scale=p.s_a)  # auto
    torch.cuda.synchronize()
    for g, w in ((got.h, want.h), (got.q.codes, want.q.codes), (got.q.scale, want.q.scale), (got.a_next, want.a_next),
                 (got.q.block_scales.view(torch.uint8), want.q.block_scales.view(torch.uint8)),
                 (got.mantissa_bits, want.mantissa_bits)):
        assert torch.equal(g, w), (variant, tokens, tile)
    if "gate_up_row_amax" in _pool_names():  # (auto's T <= 2 tile allocated it)
        assert not _row_amax_pool().any()


@pytest.mark.parametrize("variant", ["auto_pf", "auto_gd", "auto_v1pf"])
@pytest.mark.parametrize("tokens", [1, 2, 8, 64, 300])
def test_prefetch_and_direct_gate_up_tables_give_auto_layer_bits(variant, tokens):
    """The sixty-third session's A/B tables, each GEMM on its own kind's tile and launched as the benchmark launches
    them (programmatic dependent launches): auto_pf and auto_v1pf (weights prefetched into L2 ahead of the PDL wait)
    and auto_gd (30B's gate_up on the direct tile) give auto's gate_up outputs and layer output bit for bit."""
    name = "qwen3-30b-a3b"
    e, h, i, k = SHAPES[name]
    p = problem(name, tokens, 800 + tokens, skew=1.0 if tokens == 300 else 0.0)
    r = p.routing
    up_tile = tile_for_rows(r.num_rows, e, variant, k=h, kind="gate_up_swiglu", n=2 * i)
    down_tile = tile_for_rows(r.num_rows, e, variant, k=i, kind="down_routed", n=h)
    got = ops.moe_gate_up(p.a, p.gate_up, r.offsets, row_index=r.row_index, row_scale=p.s_a, tile=up_tile,
                          out=_poisoned_gate_up(r.num_rows, i), pdl=True)
    got_y = ops.moe_down(got.a_next, p.down, r, row_scale=got.q.scale, tile=down_tile, pdl=True)
    want = ops.moe_gate_up(p.a, p.gate_up, r.offsets, row_index=r.row_index, row_scale=p.s_a)  # auto
    want_y = ops.moe_down(want.a_next, p.down, r, row_scale=want.q.scale)
    torch.cuda.synchronize()
    for g, w in ((got.h, want.h), (got.q.codes, want.q.codes), (got.q.scale, want.q.scale), (got.a_next, want.a_next),
                 (got.q.block_scales.view(torch.uint8), want.q.block_scales.view(torch.uint8)),
                 (got.mantissa_bits, want.mantissa_bits), (got_y, want_y)):
        assert torch.equal(g, w), (variant, tokens, up_tile, down_tile)


CLUSTER_TILES = [tile for tile in EXTRA_TILES if tile.cluster_quant]


@pytest.mark.parametrize("tokens,skew", [(1, 0.0), (64, 0.0), (300, 3.0), (4096, 1.0)])
def test_cluster_quant_tiles_equal_quantize_after(shape, tokens, skew):
    """cluster_quant's fused gate_up (a token tile's CTAs one cluster exchanging row amaxes in shared memory: 2 CTAs
    at tiny, 12 at 30B, a size above the portable 8) gives the bits of the same tile quantized afterwards, which are
    nvfp4.quantize's of its own h; every output poisoned before the launch."""
    name, (e, h, i, k) = shape
    p = problem(name, tokens, 900 + tokens, skew)
    r = p.routing
    assert CLUSTER_TILES
    for tile in CLUSTER_TILES:
        after = dataclasses.replace(tile, cluster_quant=False, quantize_after=True)
        want = ops.moe_gate_up(p.a, p.gate_up, r.offsets, row_index=r.row_index, row_scale=p.s_a, tile=after,
                               out=_poisoned_gate_up(r.num_rows, i))
        got = ops.moe_gate_up(p.a, p.gate_up, r.offsets, row_index=r.row_index, row_scale=p.s_a, tile=tile,
                              out=_poisoned_gate_up(r.num_rows, i))
        torch.cuda.synchronize()
        for g, w in ((got.h, want.h), (got.q.codes, want.q.codes), (got.q.scale, want.q.scale),
                     (got.a_next, want.a_next), (got.q.block_scales.view(torch.uint8), want.q.block_scales.view(torch.uint8)),
                     (got.mantissa_bits, want.mantissa_bits)):
            assert torch.equal(g, w), (name, tokens, tile)
        own = ref.quantize_swiglu(got.h.cpu())
        assert torch.equal(got.q.codes.cpu(), own.q.codes) and torch.equal(got.q.scale.cpu(), own.q.scale), tile
        assert torch.equal(got.mantissa_bits.cpu(), own.mantissa_bits), tile


@pytest.mark.parametrize("tokens", [8, 64, 256])
def test_auto_cq_layer_equals_auto(tokens, monkeypatch):
    """The 30B layer on auto_cq's tables (its fused decode gate_up quantizing in a cluster) gives auto's bits, as a
    programmatic dependent launch and replayed from a CUDA graph on new inputs."""
    from trace_kernels.codegen.ops import moe_gemm as codegen
    _, h, i, _ = SHAPES["qwen3-30b-a3b"]
    p = problem("qwen3-30b-a3b", tokens, 950 + tokens)
    r = p.routing

    def layer(x, s_a, up_out, y):
        up = ops.moe_gate_up(x, p.gate_up, r.offsets, row_index=r.row_index, row_scale=s_a, validate=False,
                             out=up_out, pdl=True)
        return ops.moe_down(up.a_next, p.down, r, row_scale=up.q.scale, validate=False, out=y, pdl=True)

    def fresh_buffers():
        return ops.empty_gate_up_output(r.num_rows, i, "cuda"), torch.empty(tokens, h, dtype=torch.bfloat16,
                                                                            device="cuda")

    want = layer(p.a, p.s_a, *fresh_buffers()).clone()
    monkeypatch.setattr(codegen, "DEFAULT_VARIANT", "auto_cq")
    tile = tile_for_rows(r.num_rows, p.gate_up.num_experts, k=h, kind="gate_up_swiglu", n=2 * i)
    assert tile.cluster_quant == (tokens >= 32), tile  # (T=8: auto's one-warpgroup tile, 24 CTAs: quantized after)
    up_out, y = fresh_buffers()
    y.fill_(float("nan"))
    assert torch.equal(layer(p.a, p.s_a, up_out, y), want)
    x, s_a = p.a.clone(), p.s_a.clone()
    graph = torch.cuda.CUDAGraph()
    with capture_graph(graph):
        layer(x, s_a, up_out, y)
    for seed in (1, 2):
        other = problem("qwen3-30b-a3b", tokens, 950 + tokens + seed)
        _replay_on(graph, other, x, s_a, up_out, y)
        monkeypatch.setattr(codegen, "DEFAULT_VARIANT", "auto")
        eager = layer(other.a, other.s_a, *fresh_buffers())
        monkeypatch.setattr(codegen, "DEFAULT_VARIANT", "auto_cq")
        assert torch.equal(y, eager), (tokens, seed)


def test_nonfinite_swiglu_in_a_cluster_tile_sets_the_status_word():
    """An overflowing SwiGLU row in a cluster_quant tile is reported as the last-CTA quantization of the same tile
    reports it (each CTA reports its own columns: the same count and first element), and its outputs are left as they
    were."""
    from trace_kernels.ops import raise_on_nonfinite
    p = problem("tiny", 16, 31)
    r = p.routing
    x = (p.x.float() * 1e30).to(torch.bfloat16)  # finite input; W4A16 accumulators overflow in SwiGLU
    raise_on_nonfinite(x.device)  # start clean
    messages = []
    for tile in (dataclasses.replace(CLUSTER_TILES[0], cluster_quant=False), CLUSTER_TILES[0]):
        out = _poisoned_gate_up(r.num_rows, SHAPES["tiny"][2])
        ops.moe_gate_up(x, p.gate_up, r.offsets, row_index=r.row_index, tile=tile, out=out)
        with pytest.raises(ValueError, match="non-finite") as raised:
            raise_on_nonfinite(x.device)
        messages.append(str(raised.value))
        overflowed = ~torch.isfinite(out.h.float()).all(dim=1)
        assert overflowed.any() and out.q.scale[overflowed].isnan().all(), tile  # (still the poison)
    assert messages[0] == messages[1]


def _loaded_gate_up(p, tile, i):
    """A fused gate_up call on fixed buffers (validate=False, as inside a captured layer), run once so that its kernel
    is built and loaded outside the capture that follows."""
    r = p.routing
    up_out = ops.empty_gate_up_output(r.num_rows, i, "cuda")

    def gate_up():
        ops.moe_gate_up(p.a, p.gate_up, r.offsets, row_index=r.row_index, row_scale=p.s_a, validate=False,
                        out=up_out, tile=tile)

    gate_up()
    torch.cuda.synchronize()
    return gate_up


def test_capture_without_counters_raises_before_launch(monkeypatch):
    """A fused gate_up inside a CUDA-graph capture while its tile counters do not exist yet: a clear error instead of
    counters whose zero fill only the graph's replay would run."""
    _, _, i, _ = SHAPES["qwen3-30b-a3b"]
    p = problem("qwen3-30b-a3b", 64, 21)
    gate_up = _loaded_gate_up(p, tile_for_rows(p.routing.num_rows, p.gate_up.num_experts, "v1"), i)
    monkeypatch.setattr(_common, "_counters", {})
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="inside a CUDA-graph capture"):
        with capture_graph(graph):
            gate_up()
    assert _common._counters == {}


def test_capture_of_row_amax_tile_without_its_pool_raises_before_launch(monkeypatch):
    """auto's T=1 gate_up tile (row_amax) inside a CUDA-graph capture while the tile counters exist but its per-row
    amax pool does not (an earlier warm-up ran only tiles without row_amax): the same clear error, and no pool is
    allocated inside the capture."""
    _, h, i, _ = SHAPES["qwen3-30b-a3b"]
    p = problem("qwen3-30b-a3b", 1, 23)
    tile = tile_for_rows(p.routing.num_rows, p.gate_up.num_experts, "auto", k=h, kind="gate_up_swiglu", n=2 * i)
    assert tile.row_amax
    gate_up = _loaded_gate_up(p, tile, i)
    device = torch.cuda.current_device()
    counters_only = {(device, "gate_up"): _common._counters[(device, "gate_up")]}
    monkeypatch.setattr(_common, "_counters", dict(counters_only))
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="'gate_up_row_amax'.*inside a CUDA-graph capture"):
        with capture_graph(graph):
            gate_up()
    assert _common._counters == counters_only


@pytest.mark.parametrize("variant", [*_VARIANTS, "auto_qa", "auto_ov", "v1_cb", "v1_pf"])
@pytest.mark.parametrize("tokens", [1, 8, 64, 1024])
def test_programmatic_dependent_launches_equal_plain_ones(variant, tokens):
    """pdl=True (the GEMMs start while the previous kernel runs and wait for it before reading its
    outputs) gives the plain launches' bits, eagerly and replayed from a CUDA graph whose first nodes
    poison the intermediate buffers: a kernel that read its predecessor's outputs too early would
    see NaN or stale rows."""
    from trace_kernels import ops as tk_ops
    _, h, i, _ = SHAPES["qwen3-30b-a3b"]
    p = problem("qwen3-30b-a3b", tokens, 40 + tokens)
    r = p.routing
    tile = _layer_tile(variant, r.num_rows, p.gate_up.num_experts)
    x = p.x.clone()  # [T, H] bf16: quantized inside the layer, so gate_up's predecessor is our kernel
    up_out = _poisoned_gate_up(r.num_rows, i)
    ys = empty_slot_rows(r.num_rows, h, "cuda")  # per-slot rows
    y = torch.empty(tokens, h, dtype=torch.bfloat16, device="cuda")

    def layer(pdl):
        for t in (up_out.h, up_out.a_next, up_out.q.scale, ys.values):
            t.fill_(float("nan"))
        q = tk_ops.quantize(x, dequant=True)
        up = ops.moe_gate_up(q.dequant, p.gate_up, r.offsets, row_index=r.row_index, row_scale=q.q.scale,
                             validate=False, out=up_out, tile=tile, pdl=pdl)
        return ops.moe_down(up.a_next, p.down, r, row_scale=up.q.scale, validate=False, out=y,
                            slot_workspace=ys, tile=tile, pdl=pdl)

    want = layer(False).clone()
    assert not want.isnan().any()
    for _ in range(3):
        assert torch.equal(layer(True), want)
    graph = torch.cuda.CUDAGraph()
    with capture_graph(graph):
        layer(True)
    for seed in (1, 2):
        x.copy_(problem("qwen3-30b-a3b", tokens, 40 + tokens + seed).x)
        want = layer(False).clone()
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, want), (variant, tokens, seed)


@pytest.mark.parametrize("tokens", [1, 8, 300])
def test_fused_combine_equals_the_combine_kernel(tokens):
    """The combine in the down GEMM's epilogue gives the combine kernel's bits, leaves its counters zero for the
    next launch, and refuses a routing whose slot_rows and row_index are not inverse maps before launching."""
    name, (e, h, i, k) = "qwen3-30b-a3b", SHAPES["qwen3-30b-a3b"]
    p = problem(name, tokens, 300 + tokens, skew=1.0)
    r = p.routing
    m = r.num_rows
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    a = torch.randn(m, i, device="cuda", generator=gen).to(torch.bfloat16)  # [M, I] sorted rows
    s_a = torch.rand(m, device="cuda", generator=gen) + 0.5
    want = ops.moe_down(a, p.down, r, row_scale=s_a, tile=TILE_TABLE[0][1])  # down + moe_combine launch
    fused = [t for t in TILES if t.fused_combine]
    assert len(fused) >= 4
    for tile in fused:
        for _ in range(2):  # the second launch starts from the counters the first left
            got = ops.moe_down(a, p.down, r, row_scale=s_a, tile=tile, out=torch.full_like(want, float("nan")))
            torch.cuda.synchronize()
            assert torch.equal(got, want), tile
        counters = _common._counters[(torch.cuda.current_device(), "combine")]
        assert not counters.any(), tile
    if tokens < 2:  # (no second token whose row a slot could name)
        return
    slots = r.slot_rows.clone()
    slots[[0, 1], 0] = slots[[1, 0], 0]  # token 0's first slot now names token 1's row
    bad = dataclasses.replace(r, slot_rows=slots)
    with pytest.raises(ValueError, match="inverse maps"):
        ops.moe_down(a, p.down, bad, row_scale=s_a, tile=fused[0])


@pytest.mark.skipif("ws" not in _VARIANTS, reason="ws variant excluded")
@pytest.mark.parametrize("ctas", [1, 3])
def test_ws_few_persistent_ctas_equal_v1(ctas, monkeypatch):
    """Persistent ws CTAs walking many items each (the mbarrier ring wraps across items and phases)
    give v1's outputs bit for bit: plain, fused gate_up (every NVFP4 output) and down + combine."""
    p = problem("tiny", 200, 41, skew=1.0)
    r = p.routing
    v1 = TILE_TABLE[0][1]
    want_plain = ops.moe_gemm(p.a, p.gate_up, r.offsets, row_index=r.row_index, row_scale=p.s_a, tile=v1)
    want_up = ops.moe_gate_up(p.a, p.gate_up, r.offsets, row_index=r.row_index, row_scale=p.s_a, tile=v1)
    want_y = ops.moe_down(want_up.a_next, p.down, r, row_scale=want_up.q.scale, tile=v1)
    monkeypatch.setattr(ops, "_max_persistent_ctas", ctas)
    for tile in WS_TILES:
        got_plain = ops.moe_gemm(p.a, p.gate_up, r.offsets, row_index=r.row_index, row_scale=p.s_a, tile=tile,
                                 out=torch.full_like(want_plain, float("nan")))
        got_up = ops.moe_gate_up(p.a, p.gate_up, r.offsets, row_index=r.row_index, row_scale=p.s_a, tile=tile,
                                 out=_poisoned_gate_up(r.num_rows, SHAPES["tiny"][2]))
        got_y = ops.moe_down(got_up.a_next, p.down, r, row_scale=got_up.q.scale, tile=tile,
                             out=torch.full_like(want_y, float("nan")))
        torch.cuda.synchronize()
        assert torch.equal(got_plain, want_plain), tile
        for what in ("h", "a_next", "mantissa_bits"):
            assert torch.equal(getattr(got_up, what), getattr(want_up, what)), (tile, what)
        assert torch.equal(got_up.q.codes, want_up.q.codes) and torch.equal(got_up.q.scale, want_up.q.scale), tile
        assert torch.equal(got_up.q.block_scales.view(torch.uint8), want_up.q.block_scales.view(torch.uint8)), tile
        assert torch.equal(got_y, want_y), tile


@pytest.mark.parametrize("variant", [*_VARIANTS, "auto_qa", "auto_ov"])
def test_nonfinite_swiglu_sets_the_status_word(variant):
    """An overflowing SwiGLU row is reported (ops.raise_on_nonfinite), as the reference raises."""
    from trace_kernels.ops import raise_on_nonfinite
    p = problem("tiny", 16, 31)
    r = p.routing
    x = (p.x.float() * 1e30).to(torch.bfloat16)  # finite input; W4A16 accumulators overflow in SwiGLU
    raise_on_nonfinite(x.device)  # start clean
    ops.moe_gate_up(x, p.gate_up, r.offsets, row_index=r.row_index,
                    tile=tile_for_rows(r.num_rows, p.gate_up.num_experts, variant))
    with pytest.raises(ValueError, match="non-finite"):
        raise_on_nonfinite(x.device)
    if "gate_up_row_amax" in _pool_names():  # (a quantize_after tile allocates none)
        assert not _row_amax_pool().any()  # non-finite amaxes cleared too
    with pytest.raises(ValueError, match="non-finite"):
        ref.moe_gate_up_ref(x.cpu(), p.gate_up.to("cpu"), r.offsets.cpu(), row_index=r.row_index.cpu())


@pytest.mark.parametrize("tokens", [8, 300])
def test_torch_ops_give_the_eager_bits_and_compile(tokens):
    """torch.ops.trace_kernels.moe_* on CUDA tensors (what torch.compile traces) give the eager calls' bits, called
    directly and inside torch.compile(fullgraph=True); their fake impls agree with the real outputs."""
    p = problem("qwen3-30b-a3b", tokens, 500 + tokens)
    r, w, d = p.routing, p.gate_up, p.down
    m, (_, h, i, _) = r.num_rows, SHAPES["qwen3-30b-a3b"]
    want_y = ops.moe_gemm(p.a, w, r.offsets, row_index=r.row_index, row_scale=p.s_a,
                          out=torch.full((m, 2 * i), float("nan"), dtype=torch.bfloat16, device="cuda"))
    want_up = ops.moe_gate_up(p.a, w, r.offsets, row_index=r.row_index, row_scale=p.s_a, out=_poisoned_gate_up(m, i))
    want_out = ops.moe_down(want_up.a_next, d, r, row_scale=want_up.q.scale,
                            out=torch.full((tokens, h), float("nan"), dtype=torch.bfloat16, device="cuda"))
    want = (want_up.h, want_up.q.codes, want_up.q.block_scales, want_up.q.scale, want_up.a_next,
            want_up.mantissa_bits, want_out)
    assert not want_out.isnan().any() and not want_y.isnan().any()

    def layer(a, s_a):  # [T, H] bf16, [T] fp32 -> the gate_up's six outputs and the combined [T, H]
        up = torch.ops.trace_kernels.moe_gate_up(a, w.codes, w.block_scales, w.scale, r.offsets, r.row_index, s_a, 0)
        out = torch.ops.trace_kernels.moe_down(up[4], d.codes, d.block_scales, d.scale, r.offsets, r.row_index,
                                               r.slot_rows, r.row_weight, up[3], 0)
        return (*up, out)

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    for name, got in (("direct", layer(p.a, p.s_a)), ("compiled", compiled(p.a, p.s_a))):
        for index, (g, x) in enumerate(zip(got, want)):
            assert g.dtype == x.dtype and g.shape == x.shape, (name, index)
            assert torch.equal(g.view(torch.uint8), x.view(torch.uint8)), (name, index)
    args = (p.a, w.codes, w.block_scales, w.scale, r.offsets, r.row_index, p.s_a, 0)
    assert torch.equal(torch.ops.trace_kernels.moe_gemm(*args), want_y)
    down_args = (want_up.a_next, d.codes, d.block_scales, d.scale, r.offsets, r.row_index, r.slot_rows,
                 r.row_weight, want_up.q.scale, 0)
    for op, op_args in ((ops.moe_gemm_op, args), (ops.moe_gate_up_op, args), (ops.moe_down_op, down_args)):
        torch.library.opcheck(op, op_args, test_utils=("test_faketensor",))


def test_bad_inputs_raise_before_launch():
    p = problem("tiny", 16, 9)
    r = p.routing
    misaligned = torch.empty(p.a.numel() + 1, dtype=torch.bfloat16, device="cuda")[1:].view_as(p.a)
    misaligned.copy_(p.a)
    with pytest.raises(ValueError, match="16-byte aligned"):
        ops.moe_gemm(misaligned, p.gate_up, r.offsets, row_index=r.row_index)
    bad = r.offsets.clone()
    bad[-1] += 1
    with pytest.raises(ValueError, match="must equal the number of routed rows"):
        ops.moe_gemm(p.a, p.gate_up, bad, row_index=r.row_index)
    with pytest.raises(ValueError, match="row_index values"):
        ops.moe_gemm(p.a, p.gate_up, r.offsets, row_index=r.row_index + 1000)
    with pytest.raises(ValueError, match="is on cpu"):
        ops.moe_gemm(p.a, p.gate_up, r.offsets.cpu(), row_index=r.row_index)


@pytest.mark.parametrize("groups,e,n,k", [(1, 3, 128, 128), (2, 3, 256, 192), (1, 4, 2048, 768), (2, 2, 1536, 2048)])
def test_pack_kernel_equals_the_torch_path(groups, e, n, k):
    """moe_pack (the RL weight sync's packing on the GPU) writes exactly the torch path's bytes: random
    codes, scales incl. zero (its codes become 0) and E4M3 subnormals, plain and gate/up-interleaved rows;
    the destination poisoned first."""
    from trace_kernels import moe_layout
    gen = torch.Generator(device="cuda").manual_seed(n + k + groups)
    codes = torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, device="cuda", generator=gen)
    scales = torch.randint(0, 0x7F, (e, n, k // 16), dtype=torch.uint8, device="cuda", generator=gen)
    scales[:, :, 1] = torch.randint(0, 8, (e, n), dtype=torch.uint8, device="cuda", generator=gen)  # 0, subnormals
    scales = scales.view(torch.float8_e4m3fn)
    scale = torch.rand(e, device="cuda", generator=gen)
    want = moe_layout.empty_weights(e, n, k, "cuda")
    moe_layout.store_fragments_(want, codes, scales, scale, groups, kernel=False)
    got = moe_layout.empty_weights(e, n, k, "cuda")
    for t in (got.codes, got.block_scales):
        t.fill_(0xAB)
    got.scale.fill_(float("nan"))
    ptrs = (got.codes.data_ptr(), got.block_scales.data_ptr(), got.scale.data_ptr())
    moe_layout.store_fragments_(got, codes, scales, scale, groups)  # CUDA tensors: the kernel
    torch.cuda.synchronize()
    assert ptrs == (got.codes.data_ptr(), got.block_scales.data_ptr(), got.scale.data_ptr())
    assert torch.equal(got.codes, want.codes) and torch.equal(got.block_scales, want.block_scales)
    assert torch.equal(got.scale, want.scale)
