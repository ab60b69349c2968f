"""The MoE GEMM templates render deterministically, and compile for sm_90a (nvcc, few compiles)."""

import dataclasses
import re
import subprocess
from pathlib import Path

import pytest

from trace_kernels import paths, shapes
from trace_kernels.codegen.ops import moe_gemm as codegen
from trace_kernels.codegen.render import render_spec
from trace_kernels.jit import compiler

# (K, N, kind) of every GEMM of the qwen3-30b-a3b and qwen3-235b-a22b presets
PRESET_GEMMS = ((768, 2048, "down_routed"), (1536, 4096, "down_routed"), (2048, 1536, "gate_up_swiglu"),
                (4096, 3072, "gate_up_swiglu"), (2048, 1536, "gate_up"))


def test_specs_render_deterministically_with_readable_names():
    for name in ("tiny", "qwen3-30b-a3b", "qwen3-235b-a22b"):
        shape = shapes.preset(name)
        specs = codegen.specs_for_shape(shape, tuple(codegen.TILE_TABLES))
        # one kernel per (kind, tile), auto's down GEMM with its own tables (prefill; short K); a
        # quantize_after tile builds the Swiglu kernel for gate_up_swiglu, the base tile's for the others
        call_kinds = [kind for kind in codegen.KINDS if kind != "gate_up_swiglu_h"]
        # (gather_pieces changes only the tiles with more activation pieces per K chunk than threads)
        def pieces_per_thread(tile, kind):
            n = codegen.gemm_dims(shape, kind)[0]
            return tile.tile_tokens * 8 > codegen.threads_for(tile, codegen.warpgroups_for(n, tile))

        # (cluster_quant changes only the fused gate_up's kernel, and quantizes afterwards where a cluster cannot hold
        # a token tile's CTAs)
        def as_launched(tile, kind):
            fused = kind == "gate_up_swiglu"
            if tile.cluster_quant and not (fused and codegen.cluster_fits(tile, codegen.gemm_dims(shape, kind)[0])):
                return dataclasses.replace(tile, cluster_quant=False, quantize_after=fused or tile.quantize_after)
            return tile

        kernels = {("gate_up_swiglu_h" if kind == "gate_up_swiglu" and tile.quantize_after else kind,
                    dataclasses.replace(tile, quantize_after=False,
                                        gather_pieces=tile.gather_pieces and pieces_per_thread(tile, kind)))
                   for v in codegen.TILE_TABLES for kind in call_kinds
                   for tile in (as_launched(t, kind) for _, t in
                                codegen.tile_table(v, kind, codegen.gemm_dims(shape, kind)[1]))}
        assert len({s.name for s in specs}) == len(specs) == len(kernels) + 1
        default = codegen.specs_for_shape(shape)  # what the AOT build and calls use
        assert len(default) == sum(len(codegen.tile_table(codegen.DEFAULT_VARIANT, kind,
                                                          codegen.gemm_dims(shape, kind)[1]))
                                   for kind in call_kinds) + 1
        assert codegen.DEFAULT_VARIANT == "auto"
        for spec in specs:
            assert spec.render() == spec.render()
            assert spec.name in spec.render()
    names = {s.name for s in codegen.specs_for_shape(shapes.preset("qwen3-30b-a3b"), ("v1", "ws"))}
    assert "moe_gemm_gate_up_swiglu_nvfp4_e128_h2048_i768_tn8_sm90a" in names
    assert "moe_combine_f16pair_bf16_h2048_k8_sm90a" in names
    assert "moe_gemm_gate_up_swiglu_nvfp4_e128_h2048_i768_tn8_ws1_st5_mb2_wg2_cps2_ov0_sm90a" in names


def test_n_step_tiles():
    stepped = codegen.stepped(codegen.TILE_TABLE[2][1])
    assert stepped.n_step == 8 and "_ns8_" in codegen.gemm_spec(codegen.MoEDims(8, 256, 128), "gate_up", stepped).name
    assert codegen.stepped(codegen.TILE_TABLE[-1][1]).n_step == 16  # TN=128: 8 widths, not 16
    assert codegen.stepped(codegen.TILE_TABLE[0][1]).n_step == 0  # TN=8: no narrower wgmma
    assert codegen.stepped(codegen.WS_TILE_TABLE[1][1]).n_step == 0  # ws tiles as they are
    assert codegen.stepped(codegen.DOWN_DIRECT_TN16_TILE).n_step == 0  # direct tiles as they are
    for bad in (codegen.TileConfig(32, 2, n_step=12), codegen.TileConfig(32, 2, n_step=32),
                codegen.TileConfig(24, 2, n_step=16), codegen.TileConfig(32, 4, variant="ws", n_step=8)):
        with pytest.raises(ValueError, match="n_step"):
            codegen.check_tile(bad, 256)
    # auto (before step_pipeline: auto_sp0): auto_ns0's tables (auto before n_step) with n_step on their v1 ring
    # tiles; the A/B variants of auto too
    for kind in codegen.CALL_KINDS:
        n, k = codegen.gemm_dims(shapes.preset("qwen3-30b-a3b"), kind)
        before = codegen.tile_table("auto_ns0", kind, k)
        assert all(not t.n_step for _, t in before)
        assert codegen.tile_table("auto_sp0", kind, k) == tuple((limit, codegen.stepped(t)) for limit, t in before)
        assert codegen.tile_for_rows(300 * 8, 128, "auto_cb", k=k, kind=kind, n=n).n_step == 8  # TN=32
    # (and their v1 tiles gathering whole activation pieces per thread, but in auto_gp0)
    def gathered(t):
        return dataclasses.replace(t, gather_pieces=t.variant == "v1" and t.tile_tokens >= 32)

    assert codegen.TILE_TABLES["auto_sp0"] == tuple((limit, codegen.stepped(gathered(t)))
                                                    for limit, t in codegen.AUTO_TILE_TABLE)
    assert codegen.TILE_TABLES["auto_ns0"] == tuple((limit, gathered(t)) for limit, t in codegen.AUTO_TILE_TABLE)
    assert codegen.TILE_TABLES["auto_gp0"] == tuple((limit, codegen.stepped(t)) for limit, t in codegen.AUTO_TILE_TABLE)


def test_tile_table_and_smem():
    for variant in codegen.TILE_TABLES:
        assert codegen.tile_for_rows(64 * 8, 128, variant).tile_tokens == 8  # decode: 4 rows per expert
        assert codegen.tile_for_rows(16384 * 8, 128, variant).tile_tokens == 128  # prefill
        assert codegen.tile_for_rows(64 * 8, 128, variant).variant == (
            "v1" if variant in codegen.AUTO_TABLES else variant)
    assert codegen.tile_for_rows(1 * 8, 128, "auto").variant == "ws"  # ws wins only below ~1 row per expert
    assert codegen.tile_for_rows(16384 * 8, 128, "auto").variant == "v1"  # ws loses prefill
    long_k_down_tiles = {t for _, t in codegen.AUTO_KIND_TILE_TABLES["down_routed"]}
    for tile in [t for table in codegen.TILE_TABLES.values() for _, t in table] + list(codegen.EXTRA_TILES):
        # min_blocks CTAs of the tile fit one SM's 227 KB (1 KB per CTA is reserved by the system) at a gate_up's
        # K; a weights_direct tile (its activations resident for the whole K) at the down GEMM's K it is for:
        # 30B's 768 (DOWN_SHORT_K_TABLE, extra tiles), and 235B's 1536 where the long-K table has it
        nwg = codegen.warpgroups_for(1536, tile)
        k = (1536 if tile in long_k_down_tiles else 768) if tile.weights_direct else 2048
        assert (codegen.smem_bytes(tile, nwg, 128, k) + 1024) * tile.min_blocks <= 228 * 1024, tile
    assert all(not t.weights_direct for table in codegen.TILE_TABLES.values() for _, t in table)
    with pytest.raises(ValueError, match="N % 64"):
        codegen.gemm_spec(codegen.MoEDims(8, 256, 40), "gate_up_swiglu", codegen.TILE_TABLE[0][1])
    with pytest.raises(ValueError, match="variant"):
        codegen.gemm_spec(codegen.MoEDims(8, 256, 128), "gate_up", codegen.TileConfig(8, 4, variant="v9"))
    with pytest.raises(ValueError, match="K % 128"):  # two 64-K chunks per stage
        codegen.gemm_spec(codegen.MoEDims(8, 192, 64), "down_routed",
                          codegen.TileConfig(8, 4, variant="ws", chunks_per_stage=2))
    with pytest.raises(ValueError, match="chunks_per_stage must be"):  # v1 too (ops fit it: fit_chunks)
        codegen.gemm_spec(codegen.MoEDims(8, 192, 64), "down_routed", codegen.TileConfig(8, 4, chunks_per_stage=2))
    assert "_cps2_" in codegen.gemm_spec(codegen.MoEDims(8, 256, 128), "gate_up",
                                         codegen.TileConfig(8, 4, chunks_per_stage=2)).name
    # v1's overlapped loop alternates two A buffers by ring slot and refills the stage read two stages before
    for bad in (codegen.TileConfig(8, 2, chunks_per_stage=2, overlap=True), codegen.TileConfig(8, 3, overlap=True)):
        with pytest.raises(ValueError, match="overlap needs 3 or more stages and an even number of ring slots"):
            codegen.gemm_spec(codegen.MoEDims(8, 256, 128), "gate_up", bad)
    assert "_ov1_cps2_" in codegen.gemm_spec(codegen.MoEDims(8, 256, 128), "gate_up",
                                             codegen.TileConfig(8, 4, chunks_per_stage=2, overlap=True)).name


def test_weights_direct_tiles():
    """weights_direct: a v1 tile without a ring (stages = chunks_per_stage = 1) whose activations for the whole
    K stay in shared memory; the generator's byte count mirrors MoESmem's, and bad tiles fail before a build."""
    dims = codegen.MoEDims(128, 2048, 768)
    tile = codegen.TileConfig(8, 1, 4, 1, weights_direct=4)
    spec = codegen.gemm_spec(dims, "gate_up", tile)
    assert spec.name.endswith("_tn8_st1_mb4_wg1_pf1_ov0_wd4_sm90a") and spec.params["weights_direct"] == 4
    # TN x K bf16 activations (K = 2048: 32 chunks of 8 x 128 B) + token rows, tile starts, alignment; no weights
    assert spec.params["smem_bytes"] == 32 * 8 * 128 + 8 * 12 + 129 * 4 + 16 + 1024
    assert "WDIRECT=*/4>" in render_spec(spec)
    assert "WDIRECT" not in render_spec(codegen.gemm_spec(dims, "gate_up", codegen.TILE_TABLE[0][1]))
    for bad in (codegen.TileConfig(8, 2, weights_direct=4), codegen.TileConfig(8, 1, chunks_per_stage=2, weights_direct=4),
                codegen.TileConfig(8, 5, variant="ws", weights_direct=4), codegen.TileConfig(8, 1, weights_direct=-1),
                codegen.TileConfig(8, 1, proxy_fence=False, weights_direct=2)):
        with pytest.raises(ValueError, match="weights_direct is a v1 knob"):
            codegen.gemm_spec(dims, "gate_up", bad)
    with pytest.raises(ValueError, match="stages >= 2"):
        codegen.gemm_spec(dims, "gate_up", codegen.TileConfig(8, 1))
    with pytest.raises(ValueError, match="resident"):  # 32 x 4096 x 2 bytes
        codegen.gemm_spec(codegen.MoEDims(128, 4096, 1536), "gate_up", codegen.TileConfig(32, 1, weights_direct=2))


def test_fused_combine_tiles():
    """fused_combine: the down GEMM's kernel compiles the routing's top-k in (name `_cb{k}`); the gate_up kinds run
    the tile's plain kernels (same names); ws tiles refuse it; auto_cb sets it on auto's v1 down tiles only."""
    shape = shapes.preset("qwen3-30b-a3b")
    tile = dataclasses.replace(codegen.DOWN_DIRECT_TILE, fused_combine=True)
    spec = codegen.gemm_spec(shape, "down_routed", tile)
    assert spec.name.endswith("_wd3_cb8_sm90a") and spec.launch["combine_top_k"] == 8
    assert "COMBINE_TOPK=*/8>" in render_spec(spec)
    plain = codegen.gemm_spec(shape, "down_routed", codegen.DOWN_DIRECT_TILE)
    assert plain.launch["combine_top_k"] == 0 and "COMBINE_TOPK" not in render_spec(plain)
    for kind in ("gate_up", "gate_up_swiglu_h"):
        for base in (codegen.DOWN_DIRECT_TILE, codegen.TILE_TABLE[0][1]):
            assert codegen.gemm_spec(shape, kind, dataclasses.replace(base, fused_combine=True)).name == \
                codegen.gemm_spec(shape, kind, base).name
    with pytest.raises(ValueError, match="fused_combine is a v1 knob"):
        codegen.gemm_spec(shape, "down_routed", dataclasses.replace(codegen.WS_PREFILL_DOWN_TILE, fused_combine=True))
    for rows in (8, 64 * 8, 300 * 8, 16384 * 8):  # auto_cb: auto before step_pipeline (auto_sp0), combining
        auto = codegen.tile_for_rows(rows, 128, "auto_sp0", k=768, kind="down_routed", n=2048)
        cb = codegen.tile_for_rows(rows, 128, "auto_cb", k=768, kind="down_routed", n=2048)
        assert cb == dataclasses.replace(auto, fused_combine=auto.variant == "v1")
        assert codegen.tile_for_rows(rows, 128, "auto_cb", k=2048, kind="gate_up", n=1536) == \
            codegen.tile_for_rows(rows, 128, "auto_sp0", k=2048, kind="gate_up", n=1536)


def test_auto_ov_overlaps_auto_v1_tiles():
    """auto_ov (A/B table): auto's tiles before step_pipeline (auto_sp0) per GEMM kind, each v1 ring tile with the
    overlapped main loop (ws and weights_direct tiles as they are)."""
    ov = codegen.overlapped
    tile = codegen.TileConfig(8, 2, chunks_per_stage=4)
    assert ov(tile) == codegen.TileConfig(8, 4, chunks_per_stage=2, overlap=True)
    assert ov(codegen.TileConfig(128, 4)) == codegen.TileConfig(128, 4, min_blocks=1, overlap=True)
    ws = codegen.WS_TILE_TABLE[0][1]
    assert ov(ws) == ws
    for kind in codegen.CALL_KINDS:
        for k in (128, 768, 2048):
            auto, auto_ov = codegen.tile_table("auto_sp0", kind, k), codegen.tile_table("auto_ov", kind, k)
            assert [limit for limit, _ in auto] == [limit for limit, _ in auto_ov]
            for (_, a), (_, b) in zip(auto, auto_ov):
                assert b == ov(a) and (b.overlap or b.variant == "ws" or b.weights_direct), (kind, k, a, b)
                codegen.check_tile(codegen.fit_chunks(b, k), k)


def test_ptxas_report_names_serialized_wgmma():
    """ptxas's C751x notes mean it serialized the wgmmas (a wait after each); the report lists their codes."""
    text = ("ptxas info    : (C7513) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
            "non wgmma instructions defining input registers of a wgmma between start and end of the pipeline stage "
            "in the function 'k'\nptxas info    : (C7511) Potential Performance Loss: wgmma.mma_async instructions are "
            "serialized due to insufficient register resources for the wgmma pipeline in the function 'k'\n"
            "ptxas info    : Used 48 registers, used 1 barriers\n")
    report = compiler.parse_ptxas(text)
    assert report.wgmma_serialized == ("C7511", "C7513") and report.registers == 48
    assert compiler.parse_ptxas("ptxas info    : Used 48 registers\n").wgmma_serialized == ()


def _compile(spec, tmp_path: Path):
    src = tmp_path / f"{spec.name}.cu"
    src.write_text(spec.render())
    report = compiler.compile_cubin(spec, src, tmp_path / f"{spec.name}.cubin", compiler.find_nvcc())
    assert report.spill_stores == 0 and report.spill_loads == 0 and report.stack_frame == 0, report.text
    assert not report.wgmma_serialized, report.text  # ptxas would wait after every wgmma
    assert "warning" not in report.text, report.text  # nvcc's diagnostics of the headers, e.g. a remainder by zero
    return report


@pytest.mark.nvcc
def test_pack_template_compiles_for_sm90a(tmp_path):
    """moe_pack (interleaved rows; the plain kernel differs by one template constant): no spills, no stack."""
    from trace_kernels.codegen.ops import moe_pack
    assert moe_pack.spec(1).name == "moe_pack_nvfp4_g1_sm90a" and moe_pack.spec(2).render() == moe_pack.spec(2).render()
    with pytest.raises(ValueError, match="groups"):
        moe_pack.spec(3)
    _compile(moe_pack.spec(2), tmp_path)


@pytest.mark.nvcc
@pytest.mark.parametrize("preset,kind,tile_tokens,variant", [
    ("tiny", "gate_up_swiglu", 8, "v1"),
    ("qwen3-30b-a3b", "down_routed", 128, "v1"),
    ("tiny", "gate_up_swiglu", 8, "ws"),
    ("tiny", "gate_up_swiglu", 8, "ws_row_amax"),  # every CTA folding its part of each row's amax
    ("tiny", "gate_up_swiglu_h", 8, "v1"),  # the SwiGLU-only epilogue of quantize_after tiles
    ("qwen3-30b-a3b", "gate_up_swiglu_h", 32, "v1_overlap"),  # two A buffers, wgmma in flight across chunks
    ("tiny", "down_routed", 16, "v1_direct"),  # weights straight into registers, 3 chunks ahead of 2
    ("tiny", "down_routed", 8, "v1_combine"),  # the ordered top-k combine in the down GEMM's epilogue
    ("tiny", "gate_up", 32, "v1_columns"),  # the wgmma width following the CTA's rows (n_step 8)
    ("qwen3-30b-a3b", "gate_up_swiglu", 8, "v1_cluster"),  # a token tile's 12 CTAs one cluster (cluster_quant)
    ("qwen3-30b-a3b", "combine", 0, ""),
])
def test_templates_compile_for_sm90a(tmp_path, preset, kind, tile_tokens, variant):
    """Each template and variant once (CI has 2 cores); no spills, no stack frame; wgmma in the PTX."""
    if not paths.cutlass_include_dirs():
        pytest.skip("nvidia-cutlass headers not installed")
    shape = shapes.preset(preset)
    if kind == "combine":
        spec = codegen.combine_spec(shape)
    else:
        tiles = ([t for t in codegen.EXTRA_TILES if t.overlap and t.variant == "v1"] if variant == "v1_overlap"
                 else [t for t in codegen.EXTRA_TILES if t.weights_direct] if variant == "v1_direct"
                 else [t for t in codegen.EXTRA_TILES if t.fused_combine] if variant == "v1_combine"
                 else [t for t in codegen.EXTRA_TILES if t.n_step and not t.weights_direct] if variant == "v1_columns"
                 else [t for t in codegen.EXTRA_TILES if t.cluster_quant] if variant == "v1_cluster"
                 else [t for t in codegen.EXTRA_TILES if t.row_amax and t.variant == "ws" and not t.async_epilogue]
                 if variant == "ws_row_amax"
                 else [t for _, t in codegen.TILE_TABLES[variant]])
        spec = codegen.gemm_spec(shape, kind, next(t for t in tiles if t.tile_tokens == tile_tokens))
    report = _compile(spec, tmp_path)
    if kind == "combine":  # every slot's loads of a block in flight at once: 8 slots x 10 words live in registers
        assert report.registers >= 80, report.text  # (without the CTAs-per-SM bound ptxas took 48 and chained them)
    if variant.startswith("ws"):  # the setmaxnreg split fits the register pool the cubin launches with
        assert codegen.ws_registers_fit(report.registers, spec.launch["warpgroups"], spec.launch["min_blocks"]), report
    if kind != "combine":
        ptx = tmp_path / "k.ptx"
        cmd = [compiler.find_nvcc(), "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=compute_90a", "-ptx",
               "--expt-relaxed-constexpr", *compiler.include_flags(spec), "-o", str(ptx), str(tmp_path / f"{spec.name}.cu")]
        subprocess.run(cmd, check=True, capture_output=True)
        text = ptx.read_text()
        assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{tile_tokens}k16\.f32\.bf16\.bf16", text)
        assert "ld.local" not in text and "st.local" not in text
        assert ("setmaxnreg" in text) == variant.startswith("ws")
        if variant == "ws_row_amax":  # the fold's unsigned max into each row's amax
            assert re.search(r"(atom|red)\.global\.max\.u32", text)  # (ptxas makes the unused-result atom a RED)
        if variant == "v1_overlap":
            assert "wgmma.wait_group.sync.aligned 1;" in text
        if variant == "v1_combine":  # the arrival counters: one thread's acq_rel atomic each, no SC fence
            assert "atom.acq_rel.gpu.global.add.s32" in text and "fence.sc" not in text and "membar" not in text
        if variant == "v1_columns":  # one main loop per width: 8, 16, 24 and 32 columns
            assert all(f"m64n{n}k16.f32.bf16.bf16" in text for n in (8, 16, 24, 32))
        if variant == "v1_direct":  # the weights never pass through shared memory
            # the prologue's (here every chunk's: K has 2) are coherent loads ahead of the wait for the previous
            # kernel, which ptxas keeps there (the .nc refills of longer K it may sink past it)
            prologue = text[:text.index("griddepcontrol.wait;")]
            assert "ld.global.L1::no_allocate.v4.u32" in prologue and "ld.global.L1::no_allocate.v2.u32" in prologue
            assert "ld.global.nc." not in prologue
        if variant == "v1_cluster":  # the cluster's size, barrier and reads of the other CTAs' shared memory
            assert ".reqnctapercluster 12, 1, 1" in text and "barrier.cluster.wait.acquire.aligned" in text
            assert "ld.shared::cluster.u32" in text and "atom.acq_rel.gpu.global.add" not in text  # (no last-CTA arrival)


_SWIZZLE_CHECK = r"""
#include <cstdio>
#include <cute/tensor.hpp>
using namespace cute;
// moe_gemm.cuh writes activation chunk (n, c) of stage s at byte s*TN*128 + n*128 + ((c ^ (n & 7)) << 4)
// and builds the wgmma descriptors from CuTe's K-major SW128 layout: both must name the same bytes.
template <int TN, int ST> int check() {
  using L = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<bfloat16_t>{}, make_shape(Int<TN>{}, Int<64>{}, Int<ST>{})));
  bfloat16_t* base = reinterpret_cast<bfloat16_t*>(uintptr_t(1) << 20);  // 1024-aligned, like the kernel's
  auto t = make_tensor(make_smem_ptr(base), L{});
  int bad = 0;
  for (int s = 0; s < ST; ++s) for (int n = 0; n < TN; ++n) for (int c = 0; c < 8; ++c)
    bad += int(&t(n, c * 8, s) - base) * 2 != s * TN * 128 + n * 128 + ((c ^ (n & 7)) << 4);
  return bad;
}
// With more pieces than threads (TN * 8 > THREADS) thread tid copies pieces j = 0 .. TN * 8 / THREADS - 1 of rows
// tid / 8 + j * THREADS / 8, column tid % 8, at piece 0's byte + j * THREADS / 8 * 128: every piece once, at CuTe's byte.
template <int TN, int THREADS> int check_pieces() {
  using L = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<bfloat16_t>{}, make_shape(Int<TN>{}, Int<64>{}, Int<1>{})));
  bfloat16_t* base = reinterpret_cast<bfloat16_t*>(uintptr_t(1) << 20);
  auto t = make_tensor(make_smem_ptr(base), L{});
  static int seen[256 * 8];
  for (int i = 0; i < TN * 8; ++i) seen[i] = 0;
  int bad = 0;
  for (int tid = 0; tid < THREADS; ++tid) {
    const int c = tid & 7, dst0 = (tid >> 3) * 128 + ((c ^ ((tid >> 3) & 7)) << 4);
    for (int j = 0; j < TN * 8 / THREADS; ++j) {
      const int n = (tid >> 3) + j * (THREADS / 8);
      seen[n * 8 + c] += 1;
      bad += int(&t(n, c * 8, 0) - base) * 2 != dst0 + j * (THREADS / 8) * 128;
    }
  }
  for (int i = 0; i < TN * 8; ++i) bad += seen[i] != 1;
  return bad;
}
int main() {
  int bad = check<8, 8>() + check<16, 3>() + check<32, 6>() + check<128, 4>() + check<256, 2>();
  bad += check_pieces<32, 128>() + check_pieces<64, 256>() + check_pieces<128, 256>() + check_pieces<128, 128>() +
         check_pieces<256, 256>();
  std::printf("mismatches %d\n", bad);
  return bad != 0;
}
"""


@pytest.mark.nvcc
def test_activation_swizzle_matches_cute(tmp_path):
    """The kernel's hand-computed 128B-swizzle addresses equal CuTe's (host-side check), the per-thread pieces of the
    tiles with more activation pieces than threads included."""
    if not paths.cutlass_include_dirs():
        pytest.skip("nvidia-cutlass headers not installed")
    src = tmp_path / "swizzle.cu"
    src.write_text(_SWIZZLE_CHECK)
    exe = tmp_path / "swizzle"
    includes = [f"-I{d}" for d in paths.cutlass_include_dirs()]
    subprocess.run([compiler.find_nvcc(), "-std=c++17", "--expt-relaxed-constexpr", *includes, "-o", str(exe),
                    str(src)], check=True, capture_output=True)
    result = subprocess.run([str(exe)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_async_epilogue_tile_names_only_the_fused_kernel():
    """async_epilogue changes only the fused gate_up kernel; the other kinds reuse the base tile's kernels."""
    shape = shapes.preset("qwen3-30b-a3b")
    tile = next(t for t in codegen.EXTRA_TILES if t.async_epilogue)
    base = codegen.TileConfig(**{**tile.__dict__, "async_epilogue": False})
    fused = codegen.gemm_spec(shape, "gate_up_swiglu", tile)
    assert "_ae1_" in fused.name and "/*ASYNC_EPI=*/true" in fused.render()
    assert fused.launch["smem_bytes"] == codegen.gemm_spec(shape, "gate_up_swiglu", base).launch["smem_bytes"] + 32
    for kind in ("gate_up", "down_routed"):
        assert codegen.gemm_spec(shape, kind, tile).render() == codegen.gemm_spec(shape, kind, base).render()
    with pytest.raises(ValueError, match="ws knobs"):
        codegen.gemm_spec(shape, "gate_up_swiglu", codegen.TileConfig(8, 4, async_epilogue=True))


def test_fused_min_blocks_bounds_only_the_fused_kernel():
    """fused_min_blocks tightens __launch_bounds__ of the v1 fused gate_up alone (its epilogue would set the
    occupancy); the plain and down kernels of the tile keep min_blocks."""
    shape = shapes.preset("qwen3-30b-a3b")
    tile = codegen.TILE_TABLE[0][1]
    assert tile.fused_min_blocks == 4 and tile.min_blocks == 2
    fused = codegen.gemm_spec(shape, "gate_up_swiglu", tile)
    assert fused.launch["min_blocks"] == 4 and "__launch_bounds__(256, 4)" in fused.render()
    for kind in ("gate_up", "down_routed"):
        spec = codegen.gemm_spec(shape, kind, tile)
        assert spec.launch["min_blocks"] == 2 and "__launch_bounds__(256, 2)" in spec.render()
    off_table = codegen.TileConfig(8, 6, fused_min_blocks=3)
    assert "_mb3_" in codegen.gemm_spec(shape, "gate_up_swiglu", off_table).name
    assert "_mb2_" in codegen.gemm_spec(shape, "down_routed", off_table).name
    with pytest.raises(ValueError, match="v1 knob"):
        codegen.gemm_spec(shape, "gate_up_swiglu", codegen.TileConfig(8, 5, variant="ws", fused_min_blocks=4))


def test_auto_falls_back_to_v1_where_ws_does_not_fit_k():
    """ws stages need K % 128 == 0: a K=64 shape (the engine's tiny-kernels preset) gets v1's tile."""
    decode_rows = 1  # 1/8 row per expert: the band auto gives to ws
    # (and v1's multi-chunk stages, which need K % (64 x chunks) == 0, become a ring of one-chunk stages)
    table = codegen.TILE_TABLE[0][1]
    cps = table.chunks_per_stage
    assert cps > 1
    fitted = dataclasses.replace(table, stages=table.stages * cps, chunks_per_stage=1)
    assert codegen.tile_for_rows(decode_rows, 8, "auto", k=64) == fitted
    assert codegen.tile_for_rows(6 * 8, 8, "v1", k=64) == fitted
    assert codegen.tile_for_rows(6 * 8, 8, "v1", k=64 * cps) == table
    assert codegen.tile_for_rows(decode_rows, 8, "auto", k=256).variant == "ws"
    small = shapes.resolve("E=8,H=64,I=64,k=2,hq=4,hkv=2,hd=64")
    specs = codegen.specs_for_shape(small, ("auto",))
    assert specs and not any("_ws1_" in s.name for s in specs)


def test_auto_fallback_keeps_the_fused_epilogue_choices():
    """Below 1/8 routed row per expert at a K the ws stages cannot take (gpt-oss-20b: K = 2880, 45 chunks) every kind
    runs v1's generic TN=8 ring as stages of one chunk, and the fused gate_up keeps the ws tile's epilogue choices:
    auto's and auto_qk's row_amax (the fastest fallback measured, forty-sixth session), auto_ra0 without it, auto_qa
    quantized afterwards."""
    e, h, i = 32, 2880, 2880
    ring = codegen.fit_chunks(codegen.TILE_TABLE[0][1], h)
    assert ring.chunks_per_stage == 1 and ring.tile_tokens == 8
    for variant, knobs in (("auto", {"row_amax": True}), ("auto_ra0", {}), ("auto_qk", {"row_amax": True}),
                           ("auto_qa", {"quantize_after": True})):
        fused = codegen.tile_for_rows(4, e, variant, k=h, kind="gate_up_swiglu", n=2 * i)  # T=1, top-4
        assert fused == dataclasses.replace(ring, **knobs), variant
    assert codegen.tile_for_rows(4, e, "auto", k=h, kind="gate_up", n=2 * i) == ring
    assert codegen.tile_for_rows(4, e, "auto", k=i, kind="down_routed", n=h) == ring
    # where the ws tile fits, nothing changes
    assert codegen.tile_for_rows(4, e, "auto", k=2048, kind="gate_up_swiglu", n=2 * i).variant == "ws"
    specs = codegen.specs_for_shape(shapes.resolve(f"E={e},H={h},I={i},k=4,hq=64,hkv=8,hd=64"))
    fused_names = [s.name for s in specs if s.name.startswith("moe_gemm_gate_up_swiglu_nvfp4")]
    assert not any("_ws1_" in s.name for s in specs) and any(name.endswith("_ra1_sm90a") for name in fused_names)


def test_auto_down_gemm_prefill_tile():
    """auto: the down GEMM's prefill tile is v1's TN=128 ring gathering whole pieces, the gate_up's tile without
    quantize_after; auto_dws keeps the ws two-m-tile tile it had until 2026-12-05 (its other rows are auto's), and a
    shape whose N that tile cannot split falls back to v1's; decode is shared; the table kernels include both."""
    prefill, decode = 4096 * 8, 64 * 8  # 256 and 4 routed rows per expert
    prefill_v1 = codegen.TILE_TABLE[-1][1]
    auto_prefill = codegen.stepped(dataclasses.replace(prefill_v1, gather_pieces=True, step_pipeline=True))
    for k, n in ((768, 2048), (1536, 4096)):  # 30B (short K table) and 235B
        assert codegen.tile_for_rows(prefill, 128, "auto", k=k, kind="down_routed", n=n) == auto_prefill
        assert codegen.tile_for_rows(prefill, 128, "auto_dws", k=k, kind="down_routed", n=n) == \
            codegen.WS_PREFILL_DOWN_TILE
        for rows in (decode, 1024 * 8):  # below the prefill row auto_dws is auto
            assert codegen.tile_for_rows(rows, 128, "auto_dws", k=k, kind="down_routed", n=n) == \
                codegen.tile_for_rows(rows, 128, "auto", k=k, kind="down_routed", n=n)
    gate_up = codegen.tile_for_rows(prefill, 128, "auto", k=2048, kind="gate_up_swiglu", n=1536)
    assert gate_up == dataclasses.replace(auto_prefill, quantize_after=True)
    assert codegen.tile_for_rows(prefill, 128, "auto_dws", k=2048, kind="gate_up_swiglu", n=1536) == gate_up
    assert codegen.tile_for_rows(prefill, 128, "auto").variant == "v1"  # no kind: the shared table
    assert codegen.tile_for_rows(prefill, 128, "v1", kind="down_routed").variant == "v1"
    for kind in ("gate_up_swiglu", "gate_up"):  # decode: v1's tile (the fused gate_up's quantized after the GEMM)
        tile = codegen.tile_for_rows(decode, 128, "auto", kind=kind)
        assert dataclasses.replace(tile, quantize_after=False) == codegen.TILE_TABLE[0][1]
        assert tile.quantize_after == (kind == "gate_up_swiglu")
    # the down GEMM's decode tile takes its weights straight into registers up to 6 rows per expert, any K that
    # fits; TN=16 too up to 12 rows at a short K (auto_down2wg: the long-K table at every K), the ring at a long K
    assert codegen.tile_for_rows(decode, 128, "v1", k=768, kind="down_routed", n=2048) == codegen.TILE_TABLE[0][1]
    # N = 192: not a multiple of 64 x 2 warpgroups x 2 m-tiles -> auto_dws runs v1's TN=128 tile, as auto does
    for variant, want in (("auto", auto_prefill), ("auto_dws", auto_prefill),
                          ("auto_sp0", dataclasses.replace(auto_prefill, step_pipeline=False)),
                          ("auto_ns0", dataclasses.replace(prefill_v1, gather_pieces=True)),
                          ("auto_gp0", codegen.stepped(prefill_v1))):
        assert codegen.tile_for_rows(prefill, 8, variant, k=128, kind="down_routed", n=192) == want
    preset = shapes.preset("qwen3-30b-a3b")
    auto_names = {s.name for s in codegen.specs_for_shape(preset, ("auto",))}
    dws_names = {s.name for s in codegen.specs_for_shape(preset, ("auto_dws",))}
    ws_down = codegen.gemm_spec(preset, "down_routed", codegen.WS_PREFILL_DOWN_TILE).name
    v1_down = codegen.gemm_spec(preset, "down_routed", auto_prefill).name
    assert v1_down in auto_names and ws_down not in auto_names
    assert dws_names - auto_names == {ws_down} and auto_names - dws_names == {v1_down}


def test_quantize_after_launches_the_swiglu_h_kernel():
    """quantize_after: the fused gate_up becomes the Swiglu-epilogue kernel (h only, the plain min_blocks,
    no tile counters) followed by the quantize kernel; the other kinds keep the base tile's kernels and
    names; auto_qa is auto with the flag, kept through the ws -> v1 fallback; the table kernels of a
    quantize_after table are the _h kernels, never both."""
    shape = shapes.preset("qwen3-30b-a3b")
    base = codegen.TILE_TABLE[0][1]
    tile = codegen.TileConfig(**{**base.__dict__, "quantize_after": True})
    split = codegen.gemm_spec(shape, "gate_up_swiglu_h", tile)
    assert split.name == "moe_gemm_gate_up_swiglu_h_nvfp4_e128_h2048_i768_tn8_sm90a"
    assert "Epilogue::Swiglu>" in split.render() or "Epilogue::Swiglu," in split.render()
    assert split.launch["min_blocks"] == base.min_blocks  # fused_min_blocks bounds the quantizing kernel only
    for kind in ("gate_up", "gate_up_swiglu", "down_routed"):
        assert codegen.gemm_spec(shape, kind, tile).render() == codegen.gemm_spec(shape, kind, base).render()
    auto_qa = codegen.tile_for_rows(512, 128, "auto_qa", k=2048, kind="gate_up_swiglu", n=1536)
    assert auto_qa.quantize_after and dataclasses.replace(auto_qa, quantize_after=False) == base
    fallback = codegen.tile_for_rows(1, 8, "auto_qa", k=64, kind="gate_up_swiglu")  # ws does not fit K=64
    assert fallback.variant == "v1" and fallback.quantize_after
    names = [s.name for s in codegen.specs_for_shape(shape, ("auto_qa",))]
    assert any("gate_up_swiglu_h_" in n for n in names) and not any("gate_up_swiglu_nvfp4" in n for n in names)
    assert not any("gate_up_swiglu_h_" in s.name for s in codegen.specs_for_shape(shape, ("v1",)))
    # auto: the ws tile (<= 1/8 row per expert) keeps the in-kernel quantization, every v1 tile (the
    # one-warpgroup tile at <= 1 row per expert too) quantizes after the GEMM
    assert not codegen.tile_for_rows(8, 128, "auto", k=2048, kind="gate_up_swiglu", n=1536).quantize_after
    # below 1/8 row per expert both gate_up kernels run ws with one consumer warpgroup (the fused one folding its row
    # amaxes in every CTA), the down GEMM two
    for kind, row_amax in (("gate_up_swiglu", True), ("gate_up", False)):
        assert codegen.tile_for_rows(16, 128, "auto", k=2048, kind=kind, n=1536) == dataclasses.replace(
            codegen.WS_ONE_WARPGROUP_TILE, row_amax=row_amax)
    assert codegen.tile_for_rows(16, 128, "auto", k=768, kind="down_routed", n=2048) == codegen.WS_TILE_TABLE[0][1]
    t8 = codegen.tile_for_rows(64, 128, "auto", k=2048, kind="gate_up_swiglu", n=1536)
    assert dataclasses.replace(t8, quantize_after=False) == codegen.V1_ONE_WARPGROUP_DECODE_TILE and t8.quantize_after
    assert codegen.tile_for_rows(64, 128, "auto", k=768, kind="down_routed", n=2048) == codegen.DOWN_DIRECT_TILE
    for rows in (512, 8192, 131072):
        assert codegen.tile_for_rows(rows, 128, "auto", k=2048, kind="gate_up_swiglu", n=1536).quantize_after
    # auto_qk: auto with every fused gate_up quantized by its own last CTA; the other kinds as auto
    for rows in (8, 64, 512, 8192, 131072):
        qk = codegen.tile_for_rows(rows, 128, "auto_qk", k=2048, kind="gate_up_swiglu", n=1536)
        auto = codegen.tile_for_rows(rows, 128, "auto", k=2048, kind="gate_up_swiglu", n=1536)
        assert not qk.quantize_after and qk == dataclasses.replace(auto, quantize_after=False)
        for kind, k, n in (("gate_up", 2048, 1536), ("down_routed", 768, 2048)):
            assert (codegen.tile_for_rows(rows, 128, "auto_qk", k=k, kind=kind, n=n)
                    == codegen.tile_for_rows(rows, 128, "auto", k=k, kind=kind, n=n))
    qk_names = [s.name for s in codegen.specs_for_shape(shape, ("auto_qk",))]
    assert not any("gate_up_swiglu_h_" in n for n in qk_names)


def test_gather_pieces_kernels_and_refusals():
    """gather_pieces (auto's v1 tiles; auto_gp0 is auto without it) copies a chunk's TN x 8 activation pieces as a
    whole number per thread where there are more pieces than threads: its own kernel there ("_gp1"), the same kernel
    as without it elsewhere; a tile whose pieces do not divide among the threads (TN=24 on one warpgroup: 192
    pieces, 128 threads) and a ws tile raise before anything is compiled. Without it every v1 tile keeps the strided
    loop."""
    shape = shapes.preset("tiny")
    gp = {"gather_pieces": True}
    with pytest.raises(ValueError, match="activation pieces"):
        codegen.gemm_spec(shape, "gate_up", codegen.TileConfig(24, 4, warpgroups=1, **gp))
    with pytest.raises(ValueError, match="gather_pieces is a v1 knob"):
        codegen.gemm_spec(shape, "gate_up", codegen.TileConfig(8, 5, 2, 2, variant="ws", chunks_per_stage=2, **gp))
    codegen.gemm_spec(shape, "gate_up", codegen.TileConfig(24, 4, warpgroups=1))  # the strided loop takes any TN
    for tile in (codegen.TileConfig(128, 4, warpgroups=1), codegen.TileConfig(32, 1, 6, 1, weights_direct=2),
                 codegen.TileConfig(128, 2, chunks_per_stage=2, n_step=16)):
        on = codegen.gemm_spec(shape, "gate_up", dataclasses.replace(tile, **gp))  # 8, 2 and 4 pieces per thread
        off = codegen.gemm_spec(shape, "gate_up", tile)
        assert on.name == off.name.replace("_sm90a", "_gp1_sm90a") and "GATHER_PIECES=*/true" in on.render()
        assert "GATHER_PIECES" not in off.render()
    for tile in (codegen.TileConfig(24, 4, warpgroups=2), codegen.TileConfig(8, 8)):  # at most one piece per thread
        assert codegen.gemm_spec(shape, "gate_up", dataclasses.replace(tile, **gp)).name == \
            codegen.gemm_spec(shape, "gate_up", tile).name
    # auto before step_pipeline (auto_sp0) differs from auto_gp0 in the prefill gate_up and down kernels alone (v1's
    # TN=128 ring in both)
    _assert_prefill_kernels_alone_differ("auto_sp0", "auto_gp0", "_gp1")


def _assert_prefill_kernels_alone_differ(variant: str, without: str, suffix: str) -> None:
    """The production kernels of `variant` and `without` (a table without one knob of its) at 30B and 235B differ in
    the three prefill ring kernels (TN=128: gate_up, fused gate_up, down) alone, named with `suffix` in `variant`."""
    for name in ("qwen3-30b-a3b", "qwen3-235b-a22b"):
        with_knob = {s.name for s in codegen.specs_for_shape(shapes.preset(name), (variant,))}
        without_knob = {s.name for s in codegen.specs_for_shape(shapes.preset(name), (without,))}
        assert sorted(n.replace(suffix, "") for n in with_knob - without_knob) == sorted(without_knob - with_knob)
        assert {n.split("_nvfp4")[0] for n in with_knob - without_knob} == {
            "moe_gemm_gate_up", "moe_gemm_gate_up_swiglu_h", "moe_gemm_down_routed"}
        assert all("_tn128_" in n and f"{suffix}_" in n for n in with_knob - without_knob)


def test_step_pipeline_knob():
    """step_pipeline: a v1 ring tile of 2+ chunks per stage renders STEP_PIPE and is named _sp1; other tiles' sources
    do not name it; tiles it cannot run are refused before any build, and a launch whose K makes the ring one chunk
    per stage drops it."""
    dims = codegen.MoEDims(128, 2048, 768, 8)
    prefill = codegen.tile_for_rows(4096 * 8, 128, "auto_sp0", k=768, kind="down_routed", n=2048)
    tile = dataclasses.replace(prefill, step_pipeline=True)
    spec = codegen.gemm_spec(dims, "down_routed", tile)
    assert spec.name.endswith("_gp1_sp1_sm90a") and "/*GATHER_PIECES=*/true, /*STEP_PIPE=*/true>" in render_spec(spec)
    assert "STEP_PIPE" not in render_spec(codegen.gemm_spec(dims, "down_routed", prefill))
    plain = codegen.gemm_spec(dims, "gate_up", codegen.TileConfig(8, 2, chunks_per_stage=4, step_pipeline=True))
    assert "/*NSTEP=*/0, /*GATHER_PIECES=*/false, /*STEP_PIPE=*/true>" in render_spec(plain)
    for bad in (dataclasses.replace(tile, chunks_per_stage=1, stages=4),
                dataclasses.replace(tile, overlap=True, stages=4),
                dataclasses.replace(tile, variant="ws", n_step=0, gather_pieces=False),
                codegen.TileConfig(8, 1, 4, 1, weights_direct=2, step_pipeline=True)):
        with pytest.raises(ValueError, match="step_pipeline"):
            codegen.gemm_spec(dims, "down_routed", bad)
    assert codegen.fit_chunks(tile, 768) == tile
    fitted = codegen.fit_chunks(tile, 64)  # one chunk of K: stages of one chunk, no pipeline
    assert fitted.chunks_per_stage == 1 and not fitted.step_pipeline
    # auto: it on the prefill ring, both GEMMs; auto_sp0 (auto without it) below that row and without it there
    for k, n, kind in PRESET_GEMMS:
        for rows in (4096 * 8, 64 * 8, 1024 * 8):
            before = codegen.tile_for_rows(rows, 128, "auto_sp0", k=k, kind=kind, n=n)
            want = dataclasses.replace(before, step_pipeline=True) if rows == 4096 * 8 else before
            assert codegen.tile_for_rows(rows, 128, "auto", k=k, kind=kind, n=n) == want
    assert codegen.TILE_TABLES["auto"] == codegen.TILE_TABLES["auto_sp0"][:-1] + (
        (float("inf"), dataclasses.replace(codegen.TILE_TABLES["auto_sp0"][-1][1], step_pipeline=True)),)
    # the older arms never ran it: auto_ns0, auto_gp0, auto_ov, auto_cb
    for variant in ("auto_sp0", "auto_ns0", "auto_gp0", "auto_ov", "auto_cb"):
        assert not any(t.step_pipeline for kind in codegen.CALL_KINDS
                       for _, t in codegen.tile_table(variant, kind, 2048))
    # the production kernels: auto's and auto_sp0's differ in the prefill ring kernels alone, named _sp1 in auto
    _assert_prefill_kernels_alone_differ("auto", "auto_sp0", "_sp1")


def test_auto_v1lo_drops_the_ws_band():
    """auto_v1lo (A/B arm): below 1/8 routed row per expert it runs auto's next band's v1 tiles, from there on auto's."""
    for k, n, kind in PRESET_GEMMS:
        assert codegen.tile_for_rows(8, 128, "auto", k=k, kind=kind, n=n).variant == "ws"
        band2 = codegen.tile_for_rows(32, 128, "auto", k=k, kind=kind, n=n)  # T=4 at top-8: v1
        assert band2.variant == "v1"
        for rows in (8, 16):
            assert codegen.tile_for_rows(rows, 128, "auto_v1lo", k=k, kind=kind, n=n) == band2
        for rows in (32, 64 * 8, 4096 * 8):
            assert codegen.tile_for_rows(rows, 128, "auto_v1lo", k=k, kind=kind, n=n) == \
                codegen.tile_for_rows(rows, 128, "auto", k=k, kind=kind, n=n)


def test_auto_v1cb_combines_in_the_first_down_band():
    """auto_v1cb (A/B arm): auto_v1lo's tiles, with the down GEMM's tile combining in its epilogue up to 1/4 routed row
    per expert (the same tile otherwise), and auto_v1lo's from there on and in the gate_up GEMMs."""
    for k, n, kind in PRESET_GEMMS:
        for rows in (8, 16, 32):  # T = 1, 2, 4 at top-8 of 128 experts
            v1lo = codegen.tile_for_rows(rows, 128, "auto_v1lo", k=k, kind=kind, n=n)
            tile = codegen.tile_for_rows(rows, 128, "auto_v1cb", k=k, kind=kind, n=n)
            if kind == "down_routed":
                assert v1lo.variant == "v1" and not v1lo.fused_combine
                assert tile == dataclasses.replace(v1lo, fused_combine=True)
            else:
                assert tile == v1lo
        for rows in (33, 64, 64 * 8, 4096 * 8):
            assert codegen.tile_for_rows(rows, 128, "auto_v1cb", k=k, kind=kind, n=n) == \
                codegen.tile_for_rows(rows, 128, "auto_v1lo", k=k, kind=kind, n=n)


def test_l2_prefetch_knob_and_tables():
    """l2_prefetch: a v1 kernel renders L2_PREFETCH and is named _l2p1 (ws refuses it); auto_pfd is auto with its v1
    down decode tiles (TN <= 32) prefetching, auto_pf with both GEMMs' too, auto_v1pf auto_v1lo's; wider tiles and ws
    tiles as they were."""
    dims = codegen.MoEDims(128, 2048, 768, 8)
    tile = dataclasses.replace(codegen.DOWN_DIRECT_TILE, l2_prefetch=True)
    spec = codegen.gemm_spec(dims, "down_routed", tile)
    assert spec.name.endswith("_l2p1_sm90a")
    assert "/*L2_PREFETCH=*/true" in render_spec(spec)
    plain = codegen.gemm_spec(dims, "down_routed", codegen.DOWN_DIRECT_TILE)
    assert "L2_PREFETCH" not in render_spec(plain) and "l2p" not in plain.name
    with pytest.raises(ValueError, match="l2_prefetch is a v1 knob"):
        codegen.gemm_spec(dims, "down_routed", dataclasses.replace(codegen.WS_ONE_WARPGROUP_TILE, l2_prefetch=True))
    for k, n, kind in PRESET_GEMMS:
        for rows in (8, 32, 64 * 8, 256 * 8, 4096 * 8):
            for variant, base, kinds in (("auto_pfd", "auto", ("down_routed",)),
                                         ("auto_pf", "auto", codegen.CALL_KINDS),
                                         ("auto_v1pf", "auto_v1lo", codegen.CALL_KINDS)):
                before = codegen.tile_for_rows(rows, 128, base, k=k, kind=kind, n=n)
                tile = codegen.tile_for_rows(rows, 128, variant, k=k, kind=kind, n=n)
                on = kind in kinds and before.variant == "v1" and before.tile_tokens <= codegen.L2_PREFETCH_MAX_TN
                assert tile == (dataclasses.replace(before, l2_prefetch=True) if on else before)
    # the decode bands prefetch (30B's down GEMM at T = 8 and 256), the prefill tile does not
    assert codegen.tile_for_rows(64, 128, "auto_pfd", k=768, kind="down_routed", n=2048).l2_prefetch
    assert codegen.tile_for_rows(2048, 128, "auto_pf", k=2048, kind="gate_up_swiglu", n=1536).l2_prefetch
    assert not codegen.tile_for_rows(4096 * 8, 128, "auto_pf", k=2048, kind="gate_up_swiglu", n=1536).l2_prefetch


def test_auto_gd_runs_a_short_k_gate_up_on_the_direct_tile():
    """auto_gd (A/B arm): a gate_up GEMM of K <= GATE_UP_DIRECT_MAX_K runs the down GEMM's direct tile (the fused one
    quantized afterwards) from above 1/8 to 1 routed row per expert (auto's one-warpgroup v1 band); the ws band, the
    down GEMM, longer K and the other bands as auto."""
    for k, n, kind in PRESET_GEMMS:
        for rows in (8, 16, 17, 32, 128, 129, 64 * 8, 4096 * 8):  # T = 1, 2, (just past 2), 4, 16, (past 16), 64, 4096
            auto = codegen.tile_for_rows(rows, 128, "auto", k=k, kind=kind, n=n)
            tile = codegen.tile_for_rows(rows, 128, "auto_gd", k=k, kind=kind, n=n)
            if kind != "down_routed" and k <= codegen.GATE_UP_DIRECT_MAX_K and 16 < rows <= 128:
                assert tile == dataclasses.replace(codegen.DOWN_DIRECT_TILE, quantize_after=kind == "gate_up_swiglu")
            else:
                assert tile == auto
    assert any(k <= codegen.GATE_UP_DIRECT_MAX_K and kind != "down_routed" for k, _, kind in PRESET_GEMMS)


def test_row_amax_knob():
    """row_amax: the fused gate_up kernel of an in-kernel quantizing tile renders ROW_AMAX and is named _ra1; the other
    kinds build the base tile's kernels; with quantize_after it is refused; auto has it on the fused gate_up tiles that
    quantize in-kernel (the ws tile at T <= 2) and auto_ra0 is auto without it, so their production kernels differ
    there alone."""
    shape = shapes.preset("qwen3-30b-a3b")
    for base in (codegen.WS_ONE_WARPGROUP_TILE, codegen.TILE_TABLE[0][1],
                 codegen.TileConfig(8, 5, 2, 2, variant="ws", chunks_per_stage=2, async_epilogue=True)):
        tile = dataclasses.replace(base, row_amax=True)
        assert tile in codegen.EXTRA_TILES
        fused = codegen.gemm_spec(shape, "gate_up_swiglu", tile)
        assert fused.name.endswith("_ra1_sm90a") and "/*ROW_AMAX=*/true>" in render_spec(fused)
        assert fused.launch["row_amax"]
        assert "ROW_AMAX" not in render_spec(codegen.gemm_spec(shape, "gate_up_swiglu", base))
        assert not codegen.gemm_spec(shape, "gate_up_swiglu", base).launch["row_amax"]
        for kind in ("gate_up", "down_routed"):
            assert codegen.gemm_spec(shape, kind, tile).render() == codegen.gemm_spec(shape, kind, base).render()
    v1 = codegen.gemm_spec(shape, "gate_up_swiglu", dataclasses.replace(codegen.TILE_TABLE[0][1], row_amax=True))
    assert "/*NSTEP=*/0, /*GATHER_PIECES=*/false, /*STEP_PIPE=*/false, /*ROW_AMAX=*/true>" in render_spec(v1)
    with pytest.raises(ValueError, match="row_amax"):
        codegen.gemm_spec(shape, "gate_up", dataclasses.replace(codegen.TILE_TABLE[0][1], row_amax=True,
                                                                quantize_after=True))
    for rows in (8, 16, 64, 512, 131072):
        for kind, k, n in (("gate_up_swiglu", 2048, 1536), ("gate_up", 2048, 1536), ("down_routed", 768, 2048)):
            auto = codegen.tile_for_rows(rows, 128, "auto", k=k, kind=kind, n=n)
            ra0 = codegen.tile_for_rows(rows, 128, "auto_ra0", k=k, kind=kind, n=n)
            in_kernel = kind == "gate_up_swiglu" and not auto.quantize_after
            assert auto == dataclasses.replace(ra0, row_amax=in_kernel) and not ra0.row_amax
            assert in_kernel == (kind == "gate_up_swiglu" and rows <= 16)  # <= 1/8 routed row per expert: ws
    # auto_qk (every fused gate_up quantized in-kernel) keeps it on auto's ws tile alone
    for rows in (8, 64, 512, 8192, 131072):
        qk = codegen.tile_for_rows(rows, 128, "auto_qk", k=2048, kind="gate_up_swiglu", n=1536)
        assert not qk.quantize_after and qk.row_amax == (qk.variant == "ws")
    for name in ("qwen3-30b-a3b", "qwen3-235b-a22b"):
        auto = {s.name for s in codegen.specs_for_shape(shapes.preset(name), ("auto",))}
        ra0 = {s.name for s in codegen.specs_for_shape(shapes.preset(name), ("auto_ra0",))}
        assert [n.replace("_ra1", "") for n in auto - ra0] == list(ra0 - auto)
        assert len(auto - ra0) == 1 and "moe_gemm_gate_up_swiglu_nvfp4" in next(iter(auto - ra0))


def test_cluster_quant_knob():
    """cluster_quant: the fused gate_up kernel of a v1 tile is compiled with its token tile's N / (64 x warpgroups)
    CTAs as one cluster (_cq1, CLUSTER_Q, 8 more shared bytes per token column); the other kinds build the base tile's
    kernels; a cluster above 16 CTAs, ws, quantize_after and row_amax are refused; auto_cq is auto with its fused
    decode v1 tiles clustered where the cluster fits (30B from 2 to 64 routed rows per expert, T=32 to 1024 at top-8;
    not 30B's one-warpgroup T=8 tile, not 235B)."""
    shape = shapes.preset("qwen3-30b-a3b")
    clustered = [t for t in codegen.EXTRA_TILES if t.cluster_quant]
    assert [t.tile_tokens for t in clustered] == [8, 16, 32]
    for tile in clustered:
        base = dataclasses.replace(tile, cluster_quant=False)
        fused = codegen.gemm_spec(shape, "gate_up_swiglu", tile)
        text = render_spec(fused)
        assert fused.name.endswith("_cq1_sm90a") and fused.launch["cluster"] == 12
        assert "__cluster_dims__(12, 1, 1)" in text and "/*ROW_AMAX=*/false, /*CLUSTER_Q=*/12>" in text
        unclustered = codegen.gemm_spec(shape, "gate_up_swiglu", base)
        assert fused.launch["smem_bytes"] == unclustered.launch["smem_bytes"] + 8 * tile.tile_tokens
        assert "cluster" not in render_spec(unclustered) and unclustered.launch["cluster"] == 0
        for kind in ("gate_up", "down_routed"):
            assert codegen.gemm_spec(shape, kind, tile).render() == codegen.gemm_spec(shape, kind, base).render()
    tiny = codegen.gemm_spec(shapes.preset("tiny"), "gate_up_swiglu", clustered[0])
    assert tiny.launch["cluster"] == 2 and "__cluster_dims__(2, 1, 1)" in render_spec(tiny)
    with pytest.raises(ValueError, match="24 CTAs per token tile"):
        codegen.gemm_spec(shapes.preset("qwen3-235b-a22b"), "gate_up_swiglu", clustered[0])
    one_warpgroup = dataclasses.replace(codegen.V1_ONE_WARPGROUP_DECODE_TILE, cluster_quant=True)
    with pytest.raises(ValueError, match="24 CTAs per token tile"):
        codegen.gemm_spec(shape, "gate_up_swiglu", one_warpgroup)
    for bad in (dataclasses.replace(clustered[0], quantize_after=True), dataclasses.replace(clustered[0], row_amax=True),
                dataclasses.replace(codegen.WS_TILE_TABLE[0][1], cluster_quant=True)):
        with pytest.raises(ValueError, match="cluster_quant"):
            codegen.gemm_spec(shape, "gate_up_swiglu", bad)
    for rows in (8, 64, 256, 512, 1024, 2048, 8192, 131072):
        for kind, k, n in (("gate_up_swiglu", 2048, 1536), ("gate_up", 2048, 1536), ("down_routed", 768, 2048),
                           ("gate_up_swiglu", 4096, 3072)):
            auto = codegen.tile_for_rows(rows, 128, "auto", k=k, kind=kind, n=n)
            cq = codegen.tile_for_rows(rows, 128, "auto_cq", k=k, kind=kind, n=n)
            clusters = kind == "gate_up_swiglu" and n == 1536 and 256 <= rows <= 8192  # (2 to 64 rows per expert)
            assert cq == (dataclasses.replace(auto, quantize_after=False, cluster_quant=True) if clusters else auto)
    for name, differ in (("qwen3-30b-a3b", 3), ("qwen3-235b-a22b", 0)):
        auto = {s.name for s in codegen.specs_for_shape(shapes.preset(name), ("auto",))}
        cq = {s.name for s in codegen.specs_for_shape(shapes.preset(name), ("auto_cq",))}
        assert len(cq - auto) == differ and all("_cq1_" in n for n in cq - auto)
