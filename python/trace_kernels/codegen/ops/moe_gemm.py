"""Codegen for the NVFP4 MoE grouped GEMMs (gate_up with fused SwiGLU-quantize, down with combine).

Per model shape and per token-tile width TN (the wgmma N dimension; tokens are the narrow side of
the swap-AB GEMM) this renders templates/moe_gemm.cu.jinja, plus one combine kernel. Which TN a
call uses comes from the tile table of the default variant, by the average number of routed rows
per expert.

Variants (TileConfig.variant; bitwise identical outputs, tested):
  "v1"  moe_gemm.cuh: every thread loads (cp.async ring + __syncthreads per K chunk), one CTA per
        (token tile, weight tile); verified on the H200 (2026-11-29).
  "ws"  moe_gemm_ws.cuh: persistent CTAs, a producer warpgroup (cp.async.bulk weights + cp.async
        activations on an mbarrier ring), consumer warpgroups decoupled; verified on the H200
        (2026-11-29, bitwise equal to v1).
  "auto" (the default) a table mixing both by regime: ws below 1/8 routed row per expert (the gate_up with
        one consumer warpgroup), v1 beyond (measured 2026-12-01 and since).
Both variants dequantize the encoded weights (moe_encoding.py) with ALU operations (moe_dequant.cuh).
DEFAULT_VARIANT (env TRACE_KERNELS_MOE_VARIANT: auto | v1 | ws) picks the table `tile_for_rows` uses; under "auto",
a tuned table of the call's GEMM (trace_kernels.moe_tables: TRACE_KERNELS_MOE_TABLES files) comes first.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace

from trace_kernels import moe_tables
from trace_kernels.codegen.registry import OpCodegen, UnsupportedShape
from trace_kernels.codegen.spec import KernelSpec, kernel_name
from trace_kernels.shapes import ModelShape

HEADERS = ("trace_kernels/moe_gemm.cuh", "trace_kernels/moe_gemm_ws.cuh", "trace_kernels/moe_dequant.cuh",
           "trace_kernels/moe_nvfp4_row.cuh")
CHUNK_K = 64  # K per pipeline stage (must match detail::kChunkK)


@dataclass(frozen=True)
class TileConfig:
    tile_tokens: int  # wgmma N: routed rows (token slots) per CTA
    stages: int  # cp.async ring depth over K chunks of 64
    min_blocks: int = 2  # __launch_bounds__ min CTAs per SM (2 caps registers at 128: overlap dequant and MMA)
    warpgroups: int = 0  # consumer warpgroups (64 weight rows each) per CTA; 0: 2 when N % 128 == 0, else 1
    proxy_fence: bool = True  # v1: fence.proxy.async per stage (moe_gemm.cuh); False is an untested experiment
    overlap: bool = False  # wgmma of chunk c in flight while chunk c+1 is dequantized (two A buffers; slower)
    variant: str = "v1"  # "v1" (moe_gemm.cuh) or "ws" (moe_gemm_ws.cuh, warp-specialized persistent)
    # K chunks of 64 per ring stage: ws, one mbarrier round trip per stage; v1, one cp.async wait and CTA
    # barrier per stage (the ring then holds stages * chunks_per_stage chunks)
    chunks_per_stage: int = 1
    m_tiles: int = 1  # ws: 64-row weight tiles per consumer warpgroup (2: half the activation re-reads)
    # ws fused gate_up: tile counter + last-CTA quantization on the producer warpgroup's spare warps
    async_epilogue: bool = False
    # v1 fused gate_up only: __launch_bounds__ min CTAs per SM (0: min_blocks). The epilogue's row
    # quantization would otherwise set the kernel's register count (and so its occupancy), while the
    # plain and down kernels of the same tile run best with min_blocks' looser bound.
    fused_min_blocks: int = 0
    # fused gate_up only: the GEMM stores SwiGLU's h (epilogue Swiglu: no tile counter, fence or last-CTA
    # quantization) and the quantize kernel then rounds h's rows (same stream, the same bits): the
    # "fused" outputs in two launches. The other kinds' kernels ignore it.
    quantize_after: bool = False
    # v1: each thread's weight bytes loaded straight into registers this many K chunks ahead, the token
    # tile's activations resident in shared memory for the whole K (one wait and CTA barrier per CTA, none
    # in the main loop); 0: weights and activations through the cp.async ring. Needs stages = 1 and
    # chunks_per_stage = 1 (no ring), TN x K x 2 bytes of shared memory.
    weights_direct: int = 0
    # v1 down GEMM only: the ordered top-k combine in its epilogue (the last of a token's CTAs per weight tile sums
    # the token's slots in slot order, the combine kernel's bits) instead of a moe_combine launch after it. The
    # other kinds' kernels ignore it. No table uses it: in the same-run A/B of the fourteenth session
    # (profiling/results/moe_combine_h200.json, auto vs auto_cb) it was 1-2% faster at T=8, even to +0.5% at T=32
    # and 0.3-7% slower from T=64 on; with its loads in flight together and acq_rel arrivals (sixty-first session,
    # moe_fused_combine_ab_h200_round{1,2}.json) faster only at 30B T=4, 0.2-1.6% slower from T=16-32 (docs/moe_gemm.md).
    fused_combine: bool = False
    # v1: the wgmmas' N is the CTA's routed rows rounded up to this step (a multiple of 8 dividing tile_tokens)
    # instead of tile_tokens: one copy of the main loop per width, picked once per CTA; 0: always tile_tokens.
    # The tensor cores then skip the columns a partly filled token tile would discard.
    n_step: int = 0
    # v1 tiles with more 16-byte activation pieces per K chunk than threads (the prefill TN=128 tile): each thread
    # copies a whole number of pieces, their source rows looked up once per CTA instead of per piece and chunk (about
    # half of the prefill stage's instructions in SASS, thirty-second session). Ignored where a chunk has at most one
    # piece per thread. "auto" sets it on its v1 tiles (tile_table; the A/B table "auto_gp0" runs auto without it).
    gather_pieces: bool = False
    # v1 ring tiles of 2+ chunks per stage: each k16 step's wgmma its own commit group, a chunk's step dequantized once the
    # previous chunk's same step has completed, the wgmmas drained once per stage instead of once per chunk (moe_gemm.cuh
    # STEP_PIPE): a warpgroup dequantizes while its own wgmmas run, with the same A registers. Thirty-seventh session:
    # each warpgroup's wait for its chunk's wgmmas held 24-30% of the prefill GEMMs' warp samples.
    step_pipeline: bool = False
    # fused gate_up quantized in-kernel only (the other kinds' kernels, and quantize_after tiles, ignore it): every CTA
    # of a token tile folds the max |h| of its part of each row into a per-row amax (an unsigned RED.MAX), and the
    # last CTA quantizes each (row, block of 16) on its own thread, without a row reduction and with one L2 round
    # trip (moe_nvfp4_row.cuh; forty-first session). auto's ws gate_up tile has it since the forty-third
    # (AUTO_GATE_UP_TABLE); the A/B table "auto_ra0" is auto without it.
    row_amax: bool = False
    # v1 fused gate_up quantized in-kernel only (the other kinds' kernels ignore it): a token tile's N / (64 x
    # warpgroups) CTAs are one thread-block cluster (at most 16: 30B's 12, not 235B's 24); each CTA folds its part of
    # each row's amax into its own shared memory, reads the other CTAs' parts after a cluster barrier and quantizes its
    # own columns of h (moe_gemm.cuh CLUSTER_Q, fifty-third session): no quantize launch after the GEMM, no last CTA.
    cluster_quant: bool = False
    # v1: before the wait for the previous kernel (a programmatic dependent launch), each warpgroup asks the TMA unit to
    # prefetch its weight chunks past those the prologue requested into L2 (cp.async.bulk.prefetch.L2, one instruction
    # per array): a down GEMM whose CTAs get resident during the gate_up's main loop then streams its weights from L2.
    # A/B tables "auto_pfd" (auto's down decode tiles), "auto_pf" (both GEMMs' decode tiles), "auto_v1pf" (auto_v1lo's).
    # On an H100 (sixty-third session, profiling/results/moe_l2_prefetch_h100_*.json) every arm was slower than auto,
    # 1-10% (down only) to 6-41% (both GEMMs), so no auto table uses it.
    l2_prefetch: bool = False


# A cluster has at most 16 CTAs on sm_90 (above 8, the portable size, with the non-portable size attribute, which
# the launch sets).
MAX_CLUSTER_CTAS = 16
PORTABLE_CLUSTER_CTAS = 8


# (largest average rows per expert, tile). Decode wants narrow N and a deep ring (the bytes are the
# weights); prefill wants wide N so each weight byte feeds more FLOPs. First boundaries from the tile
# sweep of 2026-11-29 in profiling/results/moe_gemm_h200.json (qwen3-30b-a3b, fused gate_up; TN=16 has
# taken 6 to 12 rows since, below): TN=8 is fastest up to
# 4 rows/expert (T=64: 0.212 vs 0.243 ms for TN=32), TN=32 from 8 to 16 (T=128: 0.247 vs 0.273;
# T=256: 0.263 vs 0.457 for TN=8, 0.377 for TN=128), TN=128 from 64 (T=1024: 0.518 vs 0.703).
# The decode tiles' fused gate_up asks for 4 CTAs/SM (64 registers): without that bound ptxas gives it
# 92-119 registers for the epilogue's row quantization (2 CTAs/SM; H200 2026-12-02, 30B T=64: fused
# 0.122 ms vs 0.106 at 4 CTAs/SM), while its main loop needs ~50. The plain and down kernels keep
# min_blocks=2 (50 registers, 4 CTAs/SM by shared memory): bounded at 4 they ran 4-7% slower.
# Since the fourth session of 2026-12-02 (same-run A/Bs, profiling/results/moe_gemm_h200_decode_tiles4.json,
# layer ms with quantize_after): the TN=8 ring holds its 8 chunks as 2 stages of 4 (one cp.async wait and
# CTA barrier per 256 K): 30B T=64 0.1316 / 0.1326 / 0.1372 ms and 235B 0.3968 / 0.4074 / 0.4253 for
# stages of 4 / 2 / 1 chunks; TN=16 from 6 to 12 rows per expert: T=128 (8 rows) 0.1367 vs TN=32's 0.1526
# ms on 30B, 0.4227 vs 0.4879 on 235B, and at T=192 (12 rows) 0.1465 vs 0.1557 / 0.4584 vs 0.4930, while at
# T=256 (16 rows) TN=32 wins (0.1564 vs 0.1807 ms on 30B).
# Eleventh session of 2026-12-02 (docs/moe_gemm.md, same-run sweeps and layer A/Bs on the H200):
# - TN=16 and TN=32 run 2 stages of 4 chunks too, one CTA barrier per 256 K instead of per 64-128
#   (profiling/results/moe_rings_h200.json): layer 1.5-7% faster at T=128-512 on both presets
#   (moe_gemm_h200_rings_final.json);
# - the prefill tile runs 2 stages of 2 chunks (the same 4 slots; moe_prefill_rings_h200.json): fused gate_up
#   at 30B T=16384 1.966 -> 1.908 ms;
# - TN=32 takes up to 64 rows per expert (was 32; moe_tn64_h200.json): from 32 to 64 rows it beat TN=128,
#   two token tiles per expert reading the weights twice notwithstanding, and TN=64 was never the fastest;
#   layer at T=768 / 1024 28-32% / 15-18% faster (moe_gemm_h200_tn32_band.json).
TILE_TABLE: tuple[tuple[float, TileConfig], ...] = (
    (6.0, TileConfig(tile_tokens=8, stages=2, chunks_per_stage=4, fused_min_blocks=4)),
    (12.0, TileConfig(tile_tokens=16, stages=2, chunks_per_stage=4, fused_min_blocks=4)),
    (64.0, TileConfig(tile_tokens=32, stages=2, chunks_per_stage=4, fused_min_blocks=4)),
    (float("inf"), TileConfig(tile_tokens=128, stages=2, chunks_per_stage=2)),
)
# The down GEMM's TN=32 tile: 3 stages of 2 chunks (down 0.0591 vs 0.0636 ms for 2 x 4 at 30B T=256,
# 0.1678 vs 0.1698 on 235B; the fused gate_up the other way round: 0.0878 vs 0.0889, 0.2836 vs 0.2944).
DOWN_TN32_TILE = TileConfig(tile_tokens=32, stages=3, chunks_per_stage=2, fused_min_blocks=4)

# The ws variant's table (same boundaries as v1; "auto" takes ws tiles only where its sweeps said so).
# Decode: 128 weight rows x 128 K per stage (8 KB codes + 1 KB scales + TN x 256 B tokens), 5 stages,
# 2 CTAs/SM: ~100 KB of weights in flight per SM. Prefill: 64-K stages, overlapped main loop, 1 CTA/SM.
WS_TILE_TABLE: tuple[tuple[float, TileConfig], ...] = (
    (6.0, TileConfig(8, 5, 2, 2, variant="ws", chunks_per_stage=2)),
    (32.0, TileConfig(32, 4, 2, 2, variant="ws", chunks_per_stage=2)),
    (float("inf"), TileConfig(128, 4, 1, 2, overlap=True, variant="ws")),
)
# What calls use by default: per regime the faster variant of the H200 runs of 2026-12-01 (ALU
# dequantization; profiling/results/moe_gemm_h200_dequant*.json; both variants are bitwise identical,
# so mixing them keeps batch invariance). ws wins only below ~1 routed row per expert (T=1: 30B 0.036
# vs 0.039 ms, 235B 0.058 vs 0.071); v1 from T=8 (30B T=8 0.079 vs 0.083, T=64 0.156 vs 0.179, T=256
# 0.218 vs 0.304) and at prefill (T=16384: 3.67 vs 16.2 ms).
# From 1/8 to 1 routed row per expert (T=8 at top-8 of 128 experts) v1 with one warpgroup and 4 CTAs/SM:
# in the same-run off-table A/B of 2026-12-02 (third session, profiling/results/moe_gemm_h200_decode_extra.json)
# its layer took 0.0695 vs the table's 0.0788 ms at 30B T=8 and 0.2009 vs 0.2073 at 235B T=8 (at T=64, on
# 2026-12-01, it was slower than TN=8 with two warpgroups: 0.162 vs 0.156 ms).
V1_ONE_WARPGROUP_DECODE_TILE = TileConfig(8, 4, 4, 1)
AUTO_TILE_TABLE: tuple[tuple[float, TileConfig], ...] = (
    (0.125, WS_TILE_TABLE[0][1]),
    (1.0, V1_ONE_WARPGROUP_DECODE_TILE),
    *TILE_TABLE,
)


def overlapped(tile: TileConfig) -> TileConfig:
    """A v1 tile with the overlapped main loop (two A buffers: 3 or more stages, an even ring): a ring of
    fewer stages as stages of two chunks, and TN >= 128 at 1 CTA/SM (at 2 the second A buffer spills).
    ws and weights_direct tiles (no ring), and rings it cannot take, as they are."""
    if tile.variant != "v1" or tile.overlap:
        return tile
    slots = tile.stages * tile.chunks_per_stage
    stages, cps = (tile.stages, tile.chunks_per_stage) if tile.stages >= 3 else \
        (slots // 2, 2) if slots >= 6 else (slots, 1)
    if stages < 3 or slots % 2:
        return tile
    return replace(tile, stages=stages, chunks_per_stage=cps, overlap=True,
                   min_blocks=1 if tile.tile_tokens >= 128 else tile.min_blocks)


def stepped(tile: TileConfig) -> TileConfig:
    """A v1 ring tile of TN >= 16 whose wgmmas are as wide as its CTA's routed rows rounded up to 8 (to 16 from
    TN=128: fewer copies of the main loop); ws tiles, weights_direct tiles and TN=8 as they are. What "auto" runs.

    Same-run A/B at the adopted tables (fifteenth session, profiling/results/moe_gemm_h200_columns.json, auto against
    auto_ns0, two rounds in one process): layer 1.8-6.9% faster on 30B from T=256 (T=512 0.1992-0.1998 -> 0.1931-0.1941
    ms, T=2048 0.5395 -> 0.5017-0.5028) and 3.4-10.9% on 235B from T=128 to 4096 (T=256 0.4433-0.4445 -> 0.4185-0.4194,
    T=4096 3.44-3.51 -> 3.09-3.11); T <= 64 runs TN=8 tiles. On 30B's direct TN=16 down tile (T=128-192) the copies took
    76 instead of 71 registers, 6 CTAs/SM instead of 7, and that down GEMM 8-10% longer (moe_columns_h200.json); at 7
    CTAs/SM it tied, so direct tiles keep one width."""
    if tile.variant != "v1" or tile.tile_tokens < 16 or tile.n_step or tile.weights_direct:
        return tile
    return replace(tile, n_step=8 if tile.tile_tokens <= 64 else 16)


TILE_TABLES = {"auto": AUTO_TILE_TABLE, "v1": TILE_TABLE, "ws": WS_TILE_TABLE,
               # "auto" with every fused gate_up quantized afterwards by the quantize kernel (A/B runs)
               "auto_qa": tuple((limit, replace(tile, quantize_after=True)) for limit, tile in AUTO_TILE_TABLE),
               # "auto" without DOWN_SHORT_K_TABLE: every down GEMM on the long-K table (A/B runs)
               "auto_down2wg": AUTO_TILE_TABLE,
               # "auto" with the combine in the epilogue of every v1 down tile (fused_combine; A/B runs)
               "auto_cb": AUTO_TILE_TABLE,
               # "auto" without step_pipeline on its prefill ring (A/B runs), as auto was until 2026-12-05
               "auto_sp0": AUTO_TILE_TABLE,
               # "auto" with every fused gate_up quantized by its own last CTA, v1 tiles too (A/B runs)
               "auto_qk": AUTO_TILE_TABLE,
               # "auto" without row_amax (its ws gate_up tile's rows reduced by a warp each, as until 2026-12-06)
               "auto_ra0": AUTO_TILE_TABLE,
               # "auto" with the fused gate_up's v1 decode tiles (TN <= 32) quantizing in a cluster (cluster_quant)
               # instead of afterwards, where a cluster holds a token tile's CTAs (A/B runs). Lost its A/B (fifty-fourth
               # session, an H100, profiling/results/moe_cluster_quant_h100_round{1,2}.json): the 30B layer 1-2% slower
               # at T=32, 5-6% at T=64-128, 10% at T=256, 16-17% at T=1024
               "auto_cq": AUTO_TILE_TABLE,
               # "auto" without its ws band below 1/8 routed row per expert (T <= 2 at top-8 of 128 experts): v1's next
               # band from T=1 on (A/B runs, sixty-first session)
               "auto_v1lo": AUTO_TILE_TABLE,
               # auto_v1lo with the combine in the down GEMM's epilogue up to 1/4 routed row per expert (T <= 4 at top-8
               # of 128 experts), where auto_cb gained on 30B in the sixty-first session (A/B runs, sixty-second session)
               "auto_v1cb": AUTO_TILE_TABLE,
               # "auto" with its v1 down decode tiles prefetching their weights into L2 ahead of the PDL wait
               # (l2_prefetch), "auto_pf" with both GEMMs' v1 decode tiles doing it, "auto_v1pf" auto_v1lo's (A/B runs,
               # sixty-third session)
               "auto_pfd": AUTO_TILE_TABLE, "auto_pf": AUTO_TILE_TABLE, "auto_v1pf": AUTO_TILE_TABLE,
               # "auto" with the gate_up GEMMs of a short K (GATE_UP_DIRECT_MAX_K: 30B's 2048) on the down GEMM's direct
               # tile from above 1/8 routed row per expert to 1 (T = 3 to 16 at top-8 of 128 experts), the fused one
               # quantized afterwards (A/B runs, sixty-third session; the candidate for auto, GATE_UP_DIRECT_MAX_K)
               "auto_gd": AUTO_TILE_TABLE}
# auto_v1cb's band of down tiles that combine in their epilogue (routed rows per expert)
V1CB_ROWS = 0.25
# The widest v1 tile the l2_prefetch tables set it on: the decode tiles (up to 64 routed rows per expert), whose CTAs
# read each weight byte once; a prefill tile's weights are read again from L2 by every token tile of the expert anyway.
L2_PREFETCH_MAX_TN = 32
# auto_gd's gate_up K bound: DOWN_DIRECT_TILE keeps TN x K x 2 bytes of activations resident (32 KB at K = 2048). In the
# sweep of the sixty-third session (an H100, profiling/results/moe_ws_band_sweep_h100_30b.json, fused gate_up timed
# alone) it took 30B's fused gate_up 0.0205 ms at T=2 (ws 0.0212) and 0.0284-0.0289 at T=4, where auto's ring took
# 0.0320 in the layer; at 235B's K = 4096 it was the slowest tile (T=4: 0.119-0.122 against 0.097-0.101 ms). In four
# layer rounds on the same H100 (profiling/results/moe_l2_prefetch_h100_decode_round{1..4}.json) the 30B layer took
# 6.3-8.0% less at T=4 and 2.2-2.9% less at T=16, -1.5% to +0.5% at T=8; at T=2, where the arm then ran the tile
# instead of ws, 0.2-1.2% more, so the band starts above 1/8 routed row per expert as auto's v1 band does.
GATE_UP_DIRECT_MAX_K = 2048
# The tables behind "auto" and its A/B variants: per-kind tables, the ws -> v1 fallback and, all but auto_ns0 (auto
# before n_step), v1 ring tiles whose wgmma width follows the rows (stepped)
AUTO_TABLES = ("auto", "auto_qa", "auto_down2wg", "auto_ov", "auto_cb", "auto_ns0", "auto_w64", "auto_gp0", "auto_dws",
               "auto_sp0", "auto_qk", "auto_ra0", "auto_cq", "auto_v1lo", "auto_v1cb", "auto_pfd", "auto_pf", "auto_v1pf",
               "auto_gd")
# The auto tables whose prefill ring (the last row, v1 with 2 or more chunks per stage) has each k16 step its own wgmma
# group (step_pipeline, both GEMMs; thirty-seventh and thirty-eighth sessions, H100, outputs bitwise equal): in four
# same-run sweep rounds (profiling/results/moe_step_pipeline_sweep_h100_*.json) 1.4-3.3% less time for both prefill
# GEMMs on 30B, mixed on 235B. In two layer rounds with the arms swapped (moe_step_pipeline_ab_h100_round{1,2}.json,
# whose arms auto_sp and auto are now auto and auto_sp0) the 30B layer was 0.2-3.5% faster in 5 of 6 cells from
# T=2048 (+0.1% in the sixth), its fused gate_up 0.5-2.2% faster in all six, and 235B within that run's noise (its
# control cell, T=1024, the same kernels in both arms, moved 4%). auto_sp0 is auto without it; auto_ns0, auto_gp0,
# auto_ov and auto_cb (whose combining prefill down tile never ran with it) are without it too.
STEP_PIPELINE_TABLES = ("auto", "auto_qa", "auto_down2wg", "auto_w64", "auto_dws", "auto_qk", "auto_ra0",
                        "auto_cq", "auto_v1lo", "auto_v1cb", "auto_pfd", "auto_pf", "auto_v1pf",
                        "auto_gd")
# The down GEMM's prefill tile from 2026-12-02 to 2026-12-05: ws with two 64-row weight tiles per consumer warpgroup
# (half the activation re-reads from L2), 1 CTA/SM; in the same-run sweep of 2026-12-02
# (profiling/results/moe_down_tiles_h200.json, L2 flushed) it took 7-11% less time than v1's TN=128 at T = 1024, 4096
# and 16384 on both presets (30B T=16384: 1.235 vs 1.371 ms; 235B: 4.043 vs 4.449 ms). Since v1's rings gather whole
# activation pieces per thread (gather_pieces, thirty-fourth session) v1's TN=128 is the faster down tile again: in
# the same-run sweep of the thirty-sixth session (an H100; profiling/results/moe_prefill_tiles_gp_h100_{30b,235b}.json,
# down GEMM + combine, L2 flushed, median of 10) 0.365 / 1.295 ms against 0.405 / 1.380 at 30B T=4096 / 16384, 1.025
# / 4.237 against 1.273 / 4.322 on 235B (2-20% less), so auto's down table ends with v1's prefill tile as the gate_up's
# does, and "auto_dws" is auto with this tile (A/B runs). Its fused gate_up (quantized afterwards) was 19-35% slower
# than v1's in the same sweep.
WS_PREFILL_DOWN_TILE = TileConfig(128, 4, 1, 2, variant="ws", m_tiles=2)
# The fused gate_up's v1 tiles quantize h with the quantize kernel after a GEMM that only stores it
# (quantize_after): in the same-run A/B of 2026-12-02 (profiling/results/moe_gemm_h200_quantize_after.json,
# auto vs auto_qa) the gate_up + SwiGLU + quantization cost 1-5% over the plain GEMM that way against 3-16%
# with the last-CTA quantization in the epilogue (its fence, counter and tail hold every CTA's slot), from
# T=8 on 235B and T=32 on 30B; layer 30B T=64 0.153 vs 0.160 ms, T=1024 0.380 vs 0.400. At ~1 routed row
# per expert and below (the ws tile) the second launch costs more than it saves (T=1: 0.034 vs 0.032 ms).
# The one-warpgroup tile (T=8) quantizes afterwards too since 2026-12-02 (fifth session, two rounds of
# auto vs auto_qa, profiling/results/moe_gemm_h200_qa_t8.json): layer 30B T=8 0.0664 -> 0.0637 ms, fused
# epilogue +25% -> +8% over its plain GEMM; 235B T=8 0.1838 -> 0.1775 ms, +10% -> +3%.
# Below 1/8 routed row per expert both gate_up kernels run the ws tile with one consumer warpgroup at 3 CTAs/SM
# (twice the items of the two-warpgroup tile: a shorter round-robin tail): in the same-run sweep of 2026-12-02
# (eleventh session, profiling/results/moe_t1_tiles_h200.json) its fused gate_up took 8-14% less at T = 1 and 2
# on both presets (30B T=1 0.0179 vs 0.0195 ms, 235B 0.0285 vs 0.0312). The down GEMM keeps the two-warpgroup
# tile there (235B T=1: 0.0243 vs 0.0212 ms).
WS_ONE_WARPGROUP_TILE = TileConfig(8, 5, 3, 1, variant="ws", chunks_per_stage=2)
AUTO_GATE_UP_PLAIN_TABLE = ((0.125, WS_ONE_WARPGROUP_TILE),) + AUTO_TILE_TABLE[1:]
# The ws tile, which quantizes in its last CTA, folds each row's amax in every CTA (row_amax) since 2026-12-06
# (forty-third session; two layer rounds of auto against it with the arms swapped, H200,
# profiling/results/moe_row_amax_h200_round{1,2}.json): 30B T=1 0.0256/0.0253 -> 0.0244/0.0244 ms, T=2
# 0.0303/0.0303 -> 0.0296/0.0294; 235B T=1 0.0455/0.0452 -> 0.0444/0.0443, T=2 0.0745/0.0745 -> 0.0735/0.0731.
# With it on v1's tiles too, quantizing in-kernel instead of afterwards (auto_qk with it), T=8 took 3.9-5.1% more.
AUTO_GATE_UP_TABLE = tuple((limit, replace(tile, quantize_after=tile.variant == "v1", row_amax=tile.variant == "ws"))
                           for limit, tile in AUTO_GATE_UP_PLAIN_TABLE)
# "auto" with its v1 tiles overlapped (A/B runs; per GEMM kind through tile_table, auto's tables overlapped)
TILE_TABLES["auto_ov"] = tuple((limit, overlapped(tile)) for limit, tile in AUTO_GATE_UP_TABLE)
# "auto" before its v1 ring tiles took n_step (A/B runs; per GEMM kind through tile_table)
TILE_TABLES["auto_ns0"] = AUTO_TILE_TABLE
# "auto" with a TN=64 ring from 32 to 64 routed rows per expert (A/B runs): with n_step its wgmmas cost what the rows
# do, and it dequantizes an expert's weights once per 64 rows instead of once per 32
TN64_STEPPED_TILE = TileConfig(64, 4, n_step=8)


def _with_tn64_band(table: tuple[tuple[float, TileConfig], ...]) -> tuple[tuple[float, TileConfig], ...]:
    out = []
    for limit, tile in table:
        if limit == 64.0 and tile.variant == "v1" and tile.tile_tokens == 32:
            out += [(32.0, tile), (64.0, replace(TN64_STEPPED_TILE, quantize_after=tile.quantize_after))]
        else:
            out.append((limit, tile))
    return tuple(out)


TILE_TABLES["auto_w64"] = _with_tn64_band(AUTO_TILE_TABLE)
# "auto" without gather_pieces on its v1 tiles (A/B runs; per GEMM kind through tile_table). It changes the tiles with
# more activation pieces than threads, i.e. the prefill gate_up tile; the others build the same kernels. Same-call A/B
# on an H100 (thirty-fourth session, profiling/results/moe_gather_pieces_h100_round{1,2}.json, arms swapped): the
# layer 6-16% faster at T=4096 and 16384 on both presets (30B T=16384 3.30 / 3.56 -> 3.10 / 3.00 ms, its fused gate_up
# 1.92 -> 1.65 ms; 235B 11.81 / 12.13 -> 11.18 / 10.82), the same at T=64 (same kernels) and T=1024.
TILE_TABLES["auto_gp0"] = AUTO_TILE_TABLE
# "auto" with the down GEMM's prefill tile as it was from 2026-12-02 to 2026-12-05 (WS_PREFILL_DOWN_TILE; A/B runs; per
# GEMM kind through tile_table)
TILE_TABLES["auto_dws"] = AUTO_TILE_TABLE
# The down GEMM's decode tile loads each thread's weight bytes straight into registers K chunks ahead
# (weights_direct), one warpgroup: no ring, no CTA barrier or proxy fence in the main loop. Same-run sweep of
# 2026-12-03 (thirteenth session, profiling/results/moe_direct_h200.json, L2 flushed, median of 10), down ms of the
# first direct tile (4 ahead, 4 CTAs/SM, 80 registers) against the ring tiles before: 30B T=8 / 32 / 64 0.0248 /
# 0.0421 / 0.0486 vs 0.0257 / 0.0437 / 0.0497; 235B 0.0624 / 0.1211 / 0.1417 vs 0.0683 / 0.1234 / 0.1420; its layer
# (fourteenth session, moe_gemm_h200_direct.json, two rounds against 3f014d9) 235B 0.5-3% faster at T=8-64, 30B
# within 0.5%. The gate_up GEMMs (N = 2I) gained at most 1% and keep their rings, as does the 235B down GEMM at TN=16 (0.170
# vs 0.148 ms). A K whose resident activations do not fit falls back to v1's ring (auto_fallback).
# Since the fourteenth session the tile runs 3 chunks ahead with its registers capped at 64 by 8 CTAs/SM (63 used, no
# spill): in the same-run sweep (moe_direct_regs_h200.json) the fastest direct tile on both presets (30B T=8 / 32 / 64
# 0.0247 / 0.0406 / 0.0461 ms, 235B 0.0617 / 0.1187 / 0.1386), and in three rounds of the layer A/B in the same run
# (auto against auto:downJ) 1.7-3.3% faster than 4 ahead at 4 CTAs/SM on 30B (T=32: 0.1045 vs 0.1063-0.1069 ms) and
# 0.7-1.2% on 235B (T=8: 0.1584-0.1592 vs 0.1605-0.1607). Two ahead at 4 CTAs/SM was 0.3-0.7% faster still in the 30B
# layer but 0.4-1.2% slower than 4 ahead on 235B; one ahead (47 registers) was the slowest.
DOWN_DIRECT_TILE = TileConfig(8, 1, 8, 1, weights_direct=3)
# From 6 to 12 routed rows per expert the short-K down GEMM (30B, K = 768: 24 KB resident per CTA) takes its TN=16
# tile the same way, 2 chunks ahead, 6 CTAs/SM (71 registers): in the same run T=128 / 192 layer 0.1222-0.1226 /
# 0.1309-0.1318 vs 0.1280-0.1286 / 0.1356-0.1370 ms (3-5%), down 0.0507 / 0.0540 vs 0.0543 / 0.0579 ms in the sweep.
# On 235B (K = 1536) it was 5-12% slower in the layer and the ring stays.
DOWN_DIRECT_TN16_TILE = TileConfig(16, 1, 6, 1, weights_direct=2)
AUTO_KIND_TILE_TABLES: dict[str, tuple[tuple[float, TileConfig], ...]] = {
    "down_routed": (AUTO_TILE_TABLE[0], (6.0, DOWN_DIRECT_TILE)) + tuple(
        (limit, DOWN_TN32_TILE if tile == TILE_TABLE[2][1] else tile) for limit, tile in AUTO_TILE_TABLE[3:]),
    "gate_up_swiglu": AUTO_GATE_UP_TABLE,
    "gate_up": AUTO_GATE_UP_PLAIN_TABLE,
}
# A down GEMM with a short K (30B: K = I = 768, 12 chunks) runs the one-warpgroup tile up to 6 rows per
# expert: twice the CTAs, each with half the rows, hide more of every CTA's prologue and epilogue. Same-run
# A/B of 2026-12-02 (sixth session; profiling/results/moe_down_decode_sweep_h200.json, 42 TN=8 down tilings
# on 30B; moe_gemm_h200_down1wg.json, two rounds of the layer): 30B layer T=8 / 32 / 64 0.0606-0.0612 ->
# 0.0597-0.0598, 0.1147-0.1150 -> 0.1118-0.1120, 0.1268-0.1270 -> 0.1241-0.1245 ms; on 235B (K=1536) the
# same change cost 0.4-1.2% at T=32-64, so longer K keeps the two-warpgroup tile.
DOWN_ONE_WARPGROUP_MAX_K = 1024
# Since 2026-12-03 both run DOWN_DIRECT_TILE (above) there, and the short K DOWN_DIRECT_TN16_TILE up to 12 rows.
# Below 1/8 routed row per expert both keep the two-warpgroup ws tile: with DOWN_DIRECT_TILE there too (forty-sixth
# session, an H100, four layer rounds with the arms' order alternating, profiling/results/moe_down_direct_h100_round*)
# the layer took 2.5-4.3% more at 235B T=1 and 1.2-2.7% more at 30B T=1, 2.0-2.7% less at 235B T=2, the same at 30B
# T=2. (Timed alone in a sweep, the direct down GEMM had been 7% faster at 235B T=1; in the layer its launch overlaps
# the gate_up's end, a programmatic dependent launch, and the layer decides. Why the order flips was not profiled.)
DOWN_SHORT_K_TABLE = ((0.125, WS_TILE_TABLE[0][1]), (6.0, DOWN_DIRECT_TILE), (12.0, DOWN_DIRECT_TN16_TILE),
                      *((limit, tile) for limit, tile in AUTO_KIND_TILE_TABLES["down_routed"] if limit > 12.0))
# The table calls get when they pass no tile (TRACE_KERNELS_MOE_VARIANT overrides it, for A/B runs).
DEFAULT_VARIANT = os.environ.get("TRACE_KERNELS_MOE_VARIANT", "auto")
if DEFAULT_VARIANT not in TILE_TABLES:
    raise ValueError(f"TRACE_KERNELS_MOE_VARIANT={DEFAULT_VARIANT!r}; known: {', '.join(TILE_TABLES)}")

# Off-table tilings the GPU tests check and profiling/sweep_moe_gemm_tiles.py compares: one warpgroup
# per CTA, a wider TN, no proxy fence, and the overlapped main loop (decode and prefill widths).
EXTRA_TILES: tuple[TileConfig, ...] = (
    V1_ONE_WARPGROUP_DECODE_TILE,  # (auto's tile from 1/8 to 1 routed row per expert)
    replace(V1_ONE_WARPGROUP_DECODE_TILE, quantize_after=True),  # (auto's fused gate_up tile there)
    TileConfig(64, 4, 2, 2),
    TileConfig(8, 8, 2, 0, proxy_fence=False),
    TileConfig(8, 8, 2, 0, overlap=True),
    TileConfig(128, 4, 1, 0, overlap=True),
    # ws variants beyond its table: one consumer warpgroup x 3 CTAs/SM (twice the items: a smaller
    # round-robin tail; the fastest tile at T=1 on 30B), and prefill with 256 weight rows per CTA
    # (each consumer warpgroup two m64 tiles). Measured on 2026-12-01 and dropped: four consumer
    # warpgroups x 1 CTA/SM and the overlapped decode main loop (no faster; docs/moe_gemm.md).
    WS_ONE_WARPGROUP_TILE,  # (auto's plain gate_up tile below 1/8 routed row per expert, and auto_ra0's fused)
    WS_PREFILL_DOWN_TILE,  # (auto's down tile in prefill until 2026-12-05, auto_dws's since; kept for the A/Bs)
    # the decode table tile with the fused epilogue's fence + atomic + last-CTA quantize moved off the
    # consumers onto the producer warpgroup's spare warps (T=8: 0.075 vs 0.083 ms on 30B)
    TileConfig(8, 5, 2, 2, variant="ws", chunks_per_stage=2, async_epilogue=True),
    # the per-row amax folded by every CTA (row_amax): auto's fused ws tile at T <= 2, the ws epilogue warps, v1's TN=8
    # ring and its gathering prefill ring (a CTA of 256 rows) quantizing in their last CTA
    replace(WS_ONE_WARPGROUP_TILE, row_amax=True),
    replace(WS_TILE_TABLE[0][1], async_epilogue=True, row_amax=True),
    replace(TILE_TABLE[0][1], row_amax=True),
    replace(stepped(TILE_TABLE[-1][1]), gather_pieces=True, row_amax=True),
    # v1's decode and prefill table tiles with the fused gate_up's rows quantized by the quantize kernel
    replace(TILE_TABLE[0][1], quantize_after=True),
    replace(TILE_TABLE[-1][1], quantize_after=True),
    # the TN=8 table tile's ring as 8 stages of 1 chunk (the table until 2026-12-02, with and without
    # quantize_after) and as 4 stages of 2; the TN=16 and TN=32 tables' rings until the eleventh session of
    # 2026-12-02 (4 stages of 2, 6 of 1); the one-warpgroup tile's as stages of two chunks
    TileConfig(8, 8, fused_min_blocks=4),
    TileConfig(8, 8, fused_min_blocks=4, quantize_after=True),
    TileConfig(8, 4, chunks_per_stage=2, fused_min_blocks=4, quantize_after=True),
    TileConfig(16, 4, chunks_per_stage=2, fused_min_blocks=4, quantize_after=True),
    TileConfig(32, 6, fused_min_blocks=4, quantize_after=True),
    TileConfig(128, 4, quantize_after=True),  # (the prefill tile's ring until then: 4 stages of 1 chunk)
    TileConfig(8, 3, 4, 1, chunks_per_stage=2),
    # around the TN=16 / TN=32 boundary (12 routed rows per expert): both table tiles as auto's gate_up
    # runs them (a TN=24 tile between them was slower than both at 8, 12 and 16 rows; docs/moe_gemm.md)
    replace(TILE_TABLE[1][1], quantize_after=True),
    replace(TILE_TABLE[2][1], quantize_after=True),
    # auto_ov's gate_up tiles: auto's v1 tiles with the overlapped main loop, quantized afterwards
    *(overlapped(tile) for _, tile in AUTO_GATE_UP_TABLE if tile.variant == "v1"),
    # weights straight into registers, activations resident (weights_direct): the one- and two-warpgroup
    # TN=8 tiles, a prefetch distance that does not divide K's chunks (TN=16), and a TN=32 tile whose rows
    # take several activation pieces per thread (its resident tile does not fit K=4096: 235B skips it)
    TileConfig(8, 1, 4, 1, weights_direct=4),
    TileConfig(8, 1, 4, 1, weights_direct=4, quantize_after=True),
    TileConfig(8, 1, 2, 0, weights_direct=4),
    TileConfig(16, 1, 2, 0, weights_direct=3),
    TileConfig(32, 1, 1, 1, weights_direct=2),
    # the 30B down GEMM's faster direct tile of the 2026-12-03 sweep (two chunks ahead), the same with its
    # registers capped by more CTAs per SM (6: 85 per thread; 8: 64), auto's down tiles since the fourteenth session
    # (their 6-8 CTAs/SM fit the down GEMM's short K, not a gate_up's)
    TileConfig(8, 1, 4, 1, weights_direct=2),
    TileConfig(8, 1, 6, 1, weights_direct=2),
    TileConfig(8, 1, 8, 1, weights_direct=2),
    DOWN_DIRECT_TILE,
    DOWN_DIRECT_TN16_TILE,
    # the down GEMM's combine in its epilogue (fused_combine; the other kinds run these tiles' plain kernels) on
    # the direct tiles, the TN=8 ring and the prefill width (several token tiles per expert, two warpgroups)
    replace(DOWN_DIRECT_TILE, fused_combine=True),
    replace(DOWN_DIRECT_TN16_TILE, fused_combine=True),
    replace(TILE_TABLE[0][1], fused_combine=True),
    replace(TILE_TABLE[-1][1], fused_combine=True),
    # the wgmma width following the CTA's rows (n_step): auto's TN=32 ring and prefill tile, the 30B direct TN=16 down
    # tile with it at 7 CTAs/SM (71 registers; at 6, 76 registers and one CTA less per SM, it lost), and the
    # overlapped prefill loop
    stepped(TILE_TABLE[2][1]),
    stepped(TILE_TABLE[-1][1]),
    replace(DOWN_DIRECT_TN16_TILE, min_blocks=7, n_step=8),
    TN64_STEPPED_TILE,  # (auto_w64's tile from 32 to 64 routed rows per expert)
    TileConfig(128, 4, 1, 0, overlap=True, n_step=32),
    # gather_pieces: the prefill tile as auto runs it (4 pieces per thread), with the fused epilogue
    # too; 8 per thread (one warpgroup, TN=128); 2 (auto_w64's TN=64 tile, and a one-warpgroup TN=32 ring); the
    # resident activations of a one-warpgroup TN=32 direct tile (2 per thread)
    replace(stepped(TILE_TABLE[-1][1]), gather_pieces=True),
    replace(stepped(TILE_TABLE[-1][1]), gather_pieces=True, quantize_after=True),
    TileConfig(128, 2, 2, 1, chunks_per_stage=2, gather_pieces=True),
    replace(TN64_STEPPED_TILE, gather_pieces=True),
    TileConfig(32, 4, 2, 1, chunks_per_stage=2, gather_pieces=True),
    TileConfig(32, 1, 1, 1, weights_direct=2, gather_pieces=True),
    # the prefill ring with four warpgroups in one CTA per SM (thirty-sixth session): 256 weight rows share each
    # activation tile (half the L2 activation reads per MMA), and 4 stages of 2 chunks (208 KB) put the copies three
    # stages ahead instead of one; 113-125 registers, no spill at 30B and 235B (nvcc 13.0). Swept on the H200 in the
    # thirty-seventh session: slower than auto's ring in 13 of 16 cells (the "barrier" stall it targeted was each
    # warpgroup's wgmma wait, not the CTA barrier; docs/moe_gemm.md)
    TileConfig(128, 4, 1, 4, chunks_per_stage=2, n_step=16, gather_pieces=True),
    # auto_cb's prefill down tile (thirty-seventh session): auto's, with the combine in its epilogue
    replace(stepped(TILE_TABLE[-1][1]), gather_pieces=True, fused_combine=True),
    # the wgmmas of one chunk in flight while the warpgroup dequantizes the next (step_pipeline, thirty-seventh
    # session): auto's prefill ring as auto runs both GEMMs (fused: quantized afterwards) and with the fused epilogue
    # (at TN=32, 4 chunks per stage, ptxas serializes the wgmmas: C7512 / C7518, nvcc 13.0)
    replace(stepped(TILE_TABLE[-1][1]), gather_pieces=True, step_pipeline=True),
    replace(stepped(TILE_TABLE[-1][1]), gather_pieces=True, quantize_after=True, step_pipeline=True),
    # a token tile's CTAs as one cluster that exchanges the row amaxes in shared memory (cluster_quant, fifty-third
    # session; slower than quantize_after, fifty-fourth): auto_cq's fused decode tiles, the TN=8, 16 and 32 rings (two
    # warpgroups: 12 CTAs per 30B token tile), stepped as auto runs them
    *(replace(stepped(tile), cluster_quant=True) for _, tile in TILE_TABLE[:3]),
    # the weights prefetched into L2 ahead of the PDL wait (l2_prefetch, sixty-third session), as auto_pf runs its
    # decode tiles: the down GEMM's direct tiles (the rest of K past the registers' chunks), the one-warpgroup TN=8 ring
    # quantized afterwards and the TN=32 ring (past the ring's first stages); v1's TN=8 and TN=32 table rings with it (the
    # GPU tests' "v1_pf" layer, under programmatic dependent launches)
    replace(TILE_TABLE[0][1], l2_prefetch=True),
    replace(TILE_TABLE[2][1], l2_prefetch=True),
    replace(DOWN_DIRECT_TILE, l2_prefetch=True),
    replace(DOWN_DIRECT_TN16_TILE, l2_prefetch=True),
    replace(V1_ONE_WARPGROUP_DECODE_TILE, quantize_after=True, l2_prefetch=True),
    replace(stepped(TILE_TABLE[2][1]), gather_pieces=True, quantize_after=True, l2_prefetch=True),
    # auto_gd's fused gate_up tile (sixty-third session): the down GEMM's direct tile, quantized afterwards
    replace(DOWN_DIRECT_TILE, quantize_after=True),
)

# kind -> (epilogue enum, description). N/K come from the shape: gate_up is [2I, H], down is [H, I].
KINDS = {
    "gate_up_swiglu": ("SwigluQuant", "gate_up GEMM + SwiGLU + NVFP4 row quantization + guidance"),
    # what a quantize_after tile launches for gate_up_swiglu (then the quantize kernel)
    "gate_up_swiglu_h": ("Swiglu", "gate_up GEMM + SwiGLU, bf16 h (the quantize kernel rounds it next)"),
    "gate_up": ("Plain", "gate_up GEMM, plain bf16 store (W4A16 trainer path, epilogue-cost baseline)"),
    "down_routed": ("RouterWeight", "down GEMM, rows times the router weight as scaled fp16 (then moe_combine)"),
}
CALL_KINDS = ("gate_up_swiglu", "gate_up", "down_routed")  # what the ops call; KINDS adds gate_up_swiglu_h


def launched_kind(kind: str, tile: TileConfig) -> str:
    """The kernel a call of `kind` with `tile` launches: a quantize_after tile's fused gate_up runs the
    Swiglu-epilogue GEMM (and then the quantize kernel)."""
    return "gate_up_swiglu_h" if kind == "gate_up_swiglu" and tile.quantize_after else kind


@functools.lru_cache(maxsize=None)  # asked on every launch without tile=; built from this module's constants
def tile_table(variant: str, kind: str | None = None,
               k: int | None = None) -> tuple[tuple[float, TileConfig], ...]:
    """The (rows per expert limit, tile) table of a variant, for one GEMM kind (and its K) where "auto"
    has its own."""
    if variant in ("auto_ns0", "auto_gp0", "auto_sp0"):
        table = _unstepped_table("auto", kind, k)
    else:
        table = _unstepped_table(variant, kind, k)
    return _as_auto_runs(table, variant) if variant in AUTO_TABLES else table


def _as_auto_runs(table: tuple[tuple[float, TileConfig], ...], variant: str) -> tuple[tuple[float, TileConfig], ...]:
    """An auto table's rows as that variant runs them: each tile through _auto_tile, and the prefill ring pipelining
    its k16 steps in the STEP_PIPELINE_TABLES."""
    table = tuple((limit, _auto_tile(tile, variant)) for limit, tile in table)
    return _step_pipelined(table) if variant in STEP_PIPELINE_TABLES else table


def _can_step_pipeline(tile: TileConfig) -> bool:
    """step_pipeline's tiles: v1 rings of 2 or more chunks per stage, without weights_direct or overlap."""
    return tile.variant == "v1" and not tile.weights_direct and not tile.overlap and tile.chunks_per_stage >= 2


def _step_pipelined(table: tuple[tuple[float, TileConfig], ...]) -> tuple[tuple[float, TileConfig], ...]:
    """A table whose last row (the prefill ring) pipelines its k16 steps, where that row can (_can_step_pipeline;
    fit_chunks clears it again where K is a single chunk)."""
    limit, tile = table[-1]
    if not _can_step_pipeline(tile):
        return table
    return table[:-1] + ((limit, replace(tile, step_pipeline=True)),)


def _auto_tile(tile: TileConfig, variant: str) -> TileConfig:
    """An auto table's tile as it runs: stepped (but in auto_ns0), its v1 tiles of more activation pieces per K chunk
    than one warpgroup's threads (TN >= 32) gathering whole pieces per thread (but in auto_gp0)."""
    if variant != "auto_ns0":
        tile = stepped(tile)
    if variant != "auto_gp0" and tile.variant == "v1" and tile.tile_tokens * 8 > 128:
        tile = replace(tile, gather_pieces=True)
    return tile


def _unstepped_table(variant: str, kind: str | None, k: int | None) -> tuple[tuple[float, TileConfig], ...]:
    if variant == "auto" and kind is None:
        return AUTO_TILE_TABLE
    if variant == "auto_dws" and kind is not None:  # auto's tables, the down GEMM's prefill row the ws two-m-tile tile
        table = _unstepped_table("auto", kind, k)
        return table[:-1] + ((float("inf"), WS_PREFILL_DOWN_TILE),) if kind == "down_routed" else table
    if variant == "auto_ov" and kind is not None:
        return tuple((limit, overlapped(tile)) for limit, tile in _unstepped_table("auto", kind, k))
    if variant == "auto_w64" and kind is not None:
        return _with_tn64_band(_unstepped_table("auto", kind, k))
    if variant == "auto_qk" and kind is not None:  # auto's tables, no fused gate_up quantized afterwards
        return tuple((limit, replace(tile, quantize_after=False)) for limit, tile in _unstepped_table("auto", kind, k))
    if variant == "auto_cq" and kind == "gate_up_swiglu":  # auto's, its v1 decode tiles quantizing in a cluster
        return tuple((limit, replace(tile, quantize_after=False, cluster_quant=True)
                      if tile.variant == "v1" and tile.quantize_after and tile.tile_tokens <= 32 else tile)
                     for limit, tile in _unstepped_table("auto", kind, k))
    if variant == "auto_cq" and kind is not None:  # (the other kinds: auto's tables)
        return _unstepped_table("auto", kind, k)
    if variant == "auto_ra0" and kind is not None:  # auto's tables without row_amax
        return tuple((limit, replace(tile, row_amax=False)) for limit, tile in _unstepped_table("auto", kind, k))
    if variant == "auto_v1lo" and kind is not None:  # auto's tables, the first band's ws tile dropped
        table = _unstepped_table("auto", kind, k)
        return table[1:] if table[0][1].variant == "ws" else table
    if variant == "auto_v1cb" and kind is not None:  # auto_v1lo's tables, its first down band combining below V1CB_ROWS
        table = _unstepped_table("auto_v1lo", kind, k)
        limit, tile = table[0]
        if kind != "down_routed" or tile.variant != "v1" or limit <= V1CB_ROWS:
            return table
        return ((V1CB_ROWS, replace(tile, fused_combine=True)),) + table
    if variant in ("auto_pfd", "auto_pf", "auto_v1pf") and kind is not None:  # auto's / auto_v1lo's, prefetching
        table = _unstepped_table("auto_v1lo" if variant == "auto_v1pf" else "auto", kind, k)
        if variant == "auto_pfd" and kind != "down_routed":
            return table
        return tuple((limit, replace(tile, l2_prefetch=True)
                      if tile.variant == "v1" and tile.tile_tokens <= L2_PREFETCH_MAX_TN else tile)
                     for limit, tile in table)
    if variant == "auto_gd" and kind is not None:  # auto's, a short-K gate_up's decode band on the direct tile
        table = _unstepped_table("auto", kind, k)
        if kind == "down_routed" or k is None or k > GATE_UP_DIRECT_MAX_K:
            return table
        direct = replace(DOWN_DIRECT_TILE, quantize_after=kind == "gate_up_swiglu")
        return tuple((limit, direct) if limit == 1.0 else (limit, tile) for limit, tile in table)
    if variant == "auto_cb" and kind is not None:  # auto's tables, the down GEMM's v1 tiles combining
        return tuple((limit, replace(tile, fused_combine=tile.variant == "v1" and kind == "down_routed"))
                     for limit, tile in _unstepped_table("auto", kind, k))
    short_k = k is not None and k <= DOWN_ONE_WARPGROUP_MAX_K
    if variant in ("auto", "auto_qa") and kind == "down_routed" and short_k:
        return DOWN_SHORT_K_TABLE  # (auto_qa: quantize_after is moot for the down GEMM)
    if variant in ("auto", "auto_down2wg") and kind in AUTO_KIND_TILE_TABLES:
        return AUTO_KIND_TILE_TABLES[kind]
    if variant == "auto_qa" and kind == "down_routed":
        return AUTO_KIND_TILE_TABLES[kind]  # (quantize_after is moot for the down GEMM)
    return TILE_TABLES[variant]


def tile_for_rows(num_rows: int, num_experts: int, variant: str | None = None,
                  k: int | None = None, kind: str | None = None, n: int | None = None) -> TileConfig:
    """The tile for a call with num_rows routed rows over num_experts experts (DEFAULT_VARIANT's table;
    with the GEMM kind given, "auto"'s table for that kind: AUTO_KIND_TILE_TABLES).

    With the GEMM's K (and N) given, an "auto" ws tile that K cannot use (ws stages of 128 need
    K % 128 == 0), or whose warpgroups and m-tiles do not divide N, falls back to v1's tile for the same
    rows per expert, so small and custom shapes keep working. Under "auto", a tuned table registered for the GEMM
    (kind, experts, N, K: trace_kernels.moe_tables) is used instead of auto's, its tiles as they are (checked when
    loaded).
    """
    name = variant or DEFAULT_VARIANT
    average = num_rows / max(num_experts, 1)
    if name == "auto" and kind is not None and k is not None and n is not None:
        tuned = moe_tables.lookup(kind, num_experts, n, k)
        if tuned is not None:
            return _table_tile(tuned, average)
    tile = _table_tile(tile_table(name, kind, k), average)
    if k is None:
        return tile
    return auto_fallback(tile, k, average, n, name) if name in AUTO_TABLES else fit_chunks(tile, k)


def fit_chunks(tile: TileConfig, k: int) -> TileConfig:
    """A v1 tile whose stages of chunks_per_stage K chunks do not divide K (e.g. K=64 with two): the same
    ring of chunk slots as stages of one chunk. Other tiles as they are."""
    cps = tile.chunks_per_stage
    if tile.variant == "ws" or cps == 1 or k % (CHUNK_K * cps) == 0:
        return tile
    return replace(tile, stages=tile.stages * cps, chunks_per_stage=1, step_pipeline=False)


def _table_tile(table: tuple[tuple[float, TileConfig], ...], average: float) -> TileConfig:
    return next((tile for limit, tile in table if average <= limit), table[-1][1])


def _fits(tile: TileConfig, k: int, n: int | None) -> bool:
    try:
        check_tile(tile, k)
        if n is not None:
            warpgroups_for(n, tile)
    except ValueError:
        return False
    return True


def token_tile_ctas(n: int, warpgroups: int) -> int:
    """CTAs per token tile of a v1 GEMM with N weight rows (64 per warpgroup): a cluster_quant kernel's cluster size."""
    return n // (64 * warpgroups)


def cluster_fits(tile: TileConfig, n: int) -> bool:
    """Whether a cluster_quant tile's CTAs per token tile fit one cluster."""
    try:
        return token_tile_ctas(n, warpgroups_for(n, tile)) <= MAX_CLUSTER_CTAS
    except ValueError:
        return False


def auto_fallback(tile: TileConfig, k: int, average: float, n: int | None = None, variant: str = "auto") -> TileConfig:
    """v1's tile for `average` rows per expert where the `variant` auto table's tile does not fit K (or N), as that
    table's v1 tiles run (_auto_tile), with the tile's own fused-epilogue choices (quantize_after, row_amax).

    Measured against the next row of the kind's table (forty-sixth session, an H100, gpt-oss-20b's shape, K = 2880,
    T=1, where auto's ws rows do not fit; profiling/results/moe_fallback_h100_*.json): the fused gate_up
    0.0273-0.0276 ms with row_amax against 0.0302-0.0305 without and 0.0296-0.0298 for the one-warpgroup ring quantized
    afterwards; the down GEMM 0.0200-0.0203 ms against 0.0213-0.0216 for the weights_direct tile."""
    if tile.cluster_quant and n is not None and not cluster_fits(tile, n):  # quantized afterwards instead
        tile = replace(tile, cluster_quant=False, quantize_after=True)
    if _fits(tile, k, n):
        return tile
    fallback = _table_tile(_as_auto_runs(TILE_TABLE, variant), average)
    return fit_chunks(replace(fallback, quantize_after=tile.quantize_after, row_amax=tile.row_amax), k)


@dataclass(frozen=True)
class MoEDims:
    """What the MoE kernels depend on: a ModelShape, or dims read off the weights of a call."""

    experts: int
    hidden: int
    intermediate: int
    top_k: int = 1

    @classmethod
    def of(cls, shape: "ModelShape | MoEDims") -> "MoEDims":
        if isinstance(shape, MoEDims):
            return shape
        return cls(shape.experts, shape.hidden, shape.intermediate, shape.top_k)


def gemm_dims(shape: "ModelShape | MoEDims", kind: str) -> tuple[int, int]:
    """(N, K) of one expert's weight for a GEMM kind."""
    if kind.startswith("gate_up"):
        return 2 * shape.intermediate, shape.hidden
    if kind == "down_routed":
        return shape.hidden, shape.intermediate
    raise ValueError(f"unknown MoE GEMM kind {kind!r}; known: {', '.join(KINDS)}")


def warpgroups_for(n: int, tile: TileConfig | None = None) -> int:
    mt = tile.m_tiles if tile is not None else 1
    if tile is not None and tile.warpgroups:
        if n % (64 * tile.warpgroups * mt):
            raise ValueError(f"N={n} is not a multiple of 64 * warpgroups={tile.warpgroups} * m_tiles={mt}")
        return tile.warpgroups
    if n % (64 * mt):
        raise ValueError(f"N={n} is not a multiple of 64 * m_tiles={mt}")
    return 2 if n % (128 * mt) == 0 else 1


def smem_bytes(tile: TileConfig, warpgroups: int, experts: int, k: int) -> int:
    """Mirror of MoESmem / MoEWsSmem ::bytes(E) (the kernel static_asserts it fits)."""
    if tile.variant == "ws":
        cps = tile.chunks_per_stage
        per_stage = cps * (tile.tile_tokens * CHUNK_K * 2 + warpgroups * tile.m_tiles * (2048 + 256))
        header = (2 * tile.stages + 2 + 4 * tile.async_epilogue) * 8 + 4 * tile.tile_tokens * 4 + tile.tile_tokens * 4 + 16 + (experts + 1) * 4
        return header + 1024 + tile.stages * per_stage
    if tile.weights_direct:  # one activation slot per K chunk, no weight stages
        slots, per_chunk = k // CHUNK_K, tile.tile_tokens * CHUNK_K * 2
    else:
        slots, per_chunk = tile.stages * tile.chunks_per_stage, tile.tile_tokens * CHUNK_K * 2 + warpgroups * (2048 + 256)
    amax_words = 2 * tile.tile_tokens if tile.cluster_quant else 0  # (the fused kernel's: gemm_spec passes it)
    return slots * per_chunk + tile.tile_tokens * 12 + amax_words * 4 + (experts + 1) * 4 + 16 + 1024


def threads_for(tile: TileConfig, warpgroups: int) -> int:
    """Threads per CTA: the consumer warpgroups, plus the producer warpgroup in the ws variant."""
    return 128 * warpgroups + (128 if tile.variant == "ws" else 0)


WS_PRODUCER_REGS = 64  # moe_gemm_ws.cuh kProducerRegs


def ws_register_split(warpgroups: int, min_blocks: int) -> tuple[int, int, int]:
    """(entry, consumer, producer) registers per thread of a ws kernel (mirror of moe_gemm_ws.cuh).

    setmaxnreg moves registers inside the CTA's pool of (warpgroups + 1) * 128 * entry; the kernel
    hangs if the consumers ask for more than the producer gives back, so the op checks the cubin's
    register count (`ws_registers_fit`) before the first launch.
    """
    entry = min(65536 // (128 * (warpgroups + 1) * min_blocks) // 8 * 8, 248)
    consumer = min(((warpgroups + 1) * entry - WS_PRODUCER_REGS) // warpgroups // 8 * 8, 240)
    return entry, consumer, WS_PRODUCER_REGS


def ws_registers_fit(registers: int, warpgroups: int, min_blocks: int) -> bool:
    """True if a ws cubin using `registers` per thread has the pool its setmaxnreg split needs."""
    _, consumer, producer = ws_register_split(warpgroups, min_blocks)
    return (warpgroups + 1) * registers >= warpgroups * consumer + producer


# weights_direct: the largest resident activation tile (TN x K bf16), so that the CTA fits an SM's 227 KB
DIRECT_MAX_RESIDENT_BYTES = 160 * 1024


def check_tile(tile: TileConfig, k: int) -> None:
    if tile.variant not in TILE_TABLES:
        raise ValueError(f"unknown MoE GEMM variant {tile.variant!r}; known: {', '.join(TILE_TABLES)}")
    if tile.variant != "ws" and (tile.m_tiles != 1 or tile.async_epilogue):
        raise ValueError(f"m_tiles and async_epilogue are ws knobs: {tile}")
    if tile.variant != "ws" and (tile.chunks_per_stage not in (1, 2, 4) or k % (CHUNK_K * tile.chunks_per_stage)):
        raise ValueError(f"v1 chunks_per_stage must be 1, 2 or 4 with K % (64 x it) == 0, got K={k}: {tile}")
    if tile.variant != "ws" and tile.overlap and (tile.stages < 3 or tile.stages * tile.chunks_per_stage % 2):
        raise ValueError(f"v1 overlap needs 3 or more stages and an even number of ring slots (stages x "
                         f"chunks_per_stage): {tile}")
    if tile.weights_direct:
        if tile.variant == "ws" or tile.overlap or tile.stages != 1 or tile.chunks_per_stage != 1 or \
                not tile.proxy_fence or tile.weights_direct < 1:
            raise ValueError(f"weights_direct is a v1 knob with stages = chunks_per_stage = 1, no overlap and the "
                             f"proxy fence: {tile}")
        resident = tile.tile_tokens * k * 2
        if resident > DIRECT_MAX_RESIDENT_BYTES:
            raise ValueError(f"weights_direct keeps TN x K activations resident: {resident} bytes at TN="
                             f"{tile.tile_tokens}, K={k}, more than {DIRECT_MAX_RESIDENT_BYTES}")
    elif tile.variant != "ws" and tile.stages < 2:
        raise ValueError(f"v1 needs stages >= 2 (a double buffer) without weights_direct: {tile}")
    if tile.n_step and (tile.variant == "ws" or tile.n_step % 8 or tile.n_step >= tile.tile_tokens or
                        tile.tile_tokens % tile.n_step):
        raise ValueError(f"n_step is a v1 knob: a multiple of 8 below tile_tokens that divides it: {tile}")
    if tile.step_pipeline and not _can_step_pipeline(tile):
        raise ValueError(f"step_pipeline is a v1 ring knob with 2 or more chunks per stage (no weights_direct or "
                         f"overlap): {tile}")
    if tile.row_amax and tile.quantize_after:
        raise ValueError(f"row_amax is for the fused gate_up's in-kernel quantization, not quantize_after: {tile}")
    if tile.cluster_quant and (tile.variant != "v1" or tile.quantize_after or tile.row_amax):
        raise ValueError(f"cluster_quant is a v1 knob for the fused gate_up's in-kernel quantization, without "
                         f"quantize_after and row_amax: {tile}")
    if tile.variant == "ws" and tile.l2_prefetch:
        raise ValueError(f"l2_prefetch is a v1 knob: {tile}")
    if tile.variant == "ws" and tile.fused_combine:
        raise ValueError(f"fused_combine is a v1 knob (the ws down GEMM is followed by moe_combine): {tile}")
    if tile.variant == "ws" and tile.fused_min_blocks:
        raise ValueError(f"fused_min_blocks is a v1 knob (ws splits registers by min_blocks): {tile}")
    if tile.variant == "ws":
        cps = tile.chunks_per_stage
        if tile.m_tiles not in (1, 2) or (tile.m_tiles > 1 and tile.overlap):
            raise ValueError(f"ws m_tiles must be 1 or 2 (2 without overlap): {tile}")
        if cps not in (1, 2) or k % (CHUNK_K * cps):
            raise ValueError(f"ws tile needs chunks_per_stage in (1, 2) and K % {CHUNK_K * cps} == 0, got K={k}")
        if tile.overlap and (k // (CHUNK_K * cps)) % 2:
            raise ValueError(f"overlap needs an even number of stages per K (K={k}, {cps} chunks per stage)")


def gemm_spec(shape: "ModelShape | MoEDims", kind: str, tile: TileConfig) -> KernelSpec:
    shape = MoEDims.of(shape)
    n, k = gemm_dims(shape, kind)
    if n % 64 or k % CHUNK_K:
        raise ValueError(f"{shape}: MoE GEMM {kind} needs N % 64 == 0 and K % {CHUNK_K} == 0, got N={n} K={k}")
    if kind.startswith("gate_up_swiglu") and n % 32:
        raise ValueError(f"{shape}: fused SwiGLU needs I % 16 == 0, got I={shape.intermediate}")
    epilogue, description = KINDS[kind]
    check_tile(tile, k)
    nwg = warpgroups_for(n, tile)
    async_epilogue = tile.async_epilogue and epilogue == "SwigluQuant"  # other epilogues: the same kernel
    row_amax = tile.row_amax and epilogue == "SwigluQuant"  # (likewise)
    cluster = token_tile_ctas(n, nwg) if tile.cluster_quant and epilogue == "SwigluQuant" else 0  # (likewise)
    if cluster > MAX_CLUSTER_CTAS:
        raise ValueError(f"cluster_quant: the fused gate_up's {cluster} CTAs per token tile (N={n} / 64 x {nwg} "
                         f"warpgroups) are more than one cluster holds ({MAX_CLUSTER_CTAS}): {tile}")
    smem = smem_bytes(replace(tile, async_epilogue=async_epilogue, cluster_quant=cluster > 0), nwg, shape.experts, k)
    threads = threads_for(tile, nwg)
    pieces = tile.tile_tokens * CHUNK_K * 2 // 16  # 16-byte activation pieces per K chunk
    if tile.gather_pieces and tile.variant != "v1":
        raise ValueError(f"gather_pieces is a v1 knob: {tile}")
    gather_pieces = tile.gather_pieces and pieces > threads  # (at most one piece per thread: the same kernel)
    if gather_pieces and pieces % threads:
        raise ValueError(f"gather_pieces copies a chunk's {pieces} activation pieces (TN={tile.tile_tokens} rows x 8) "
                         f"as a whole number per thread; {threads} threads do not divide them: {tile}")
    min_blocks = tile.fused_min_blocks if epilogue == "SwigluQuant" and tile.fused_min_blocks else tile.min_blocks
    # v1's table tiles keep short names; other tilings (sweeps, ws) spell out every knob
    combine_top_k = shape.top_k if tile.fused_combine and kind == "down_routed" else 0
    bare = replace(tile, quantize_after=False, fused_combine=False, gather_pieces=False, row_amax=False,
                   cluster_quant=False, l2_prefetch=False)
    table_tile = any(bare == t for _, t in TILE_TABLE) and not tile.warpgroups and not combine_top_k and \
        not gather_pieces and not row_amax and not cluster and not tile.l2_prefetch
    if tile.variant == "ws":
        extra = {"ws": 1, "st": tile.stages, "mb": tile.min_blocks, "wg": nwg, "cps": tile.chunks_per_stage,
                 "ov": int(tile.overlap), **({"mt": tile.m_tiles} if tile.m_tiles > 1 else {}),
                 **({"ae": 1} if async_epilogue else {}), **({"ra": 1} if row_amax else {})}
    elif table_tile:
        extra = {}
    else:
        extra = {"st": tile.stages, "mb": min_blocks, "wg": nwg, "pf": int(tile.proxy_fence),
                 "ov": int(tile.overlap), **({"cps": tile.chunks_per_stage} if tile.chunks_per_stage > 1 else {}),
                 **({"wd": tile.weights_direct} if tile.weights_direct else {}),
                 **({"cb": combine_top_k} if combine_top_k else {}),
                 **({"ns": tile.n_step} if tile.n_step else {}), **({"gp": 1} if gather_pieces else {}),
                 **({"sp": 1} if tile.step_pipeline else {}), **({"ra": 1} if row_amax else {}),
                 **({"cq": 1} if cluster else {}), **({"l2p": 1} if tile.l2_prefetch else {})}
    name = kernel_name("moe_gemm", kind, "nvfp4",
                       dims={"e": shape.experts, "h": shape.hidden, "i": shape.intermediate, "tn": tile.tile_tokens,
                             **extra})
    params = {"experts": shape.experts, "n": n, "k": k, "tile_tokens": tile.tile_tokens, "warpgroups": nwg,
              "stages": tile.stages, "min_blocks": min_blocks, "epilogue": epilogue,
              "proxy_fence": "true" if tile.proxy_fence else "false", "overlap": "true" if tile.overlap else "false",
              "variant": tile.variant, "chunks_per_stage": tile.chunks_per_stage,
              "m_tiles": tile.m_tiles, "weights_direct": tile.weights_direct, "combine_top_k": combine_top_k,
              "n_step": tile.n_step, "gather_pieces": "true" if gather_pieces else "",
              "step_pipeline": "true" if tile.step_pipeline else "", "row_amax": "true" if row_amax else "",
              "cluster": cluster, "l2_prefetch": "true" if tile.l2_prefetch else "",
              "async_epilogue": "true" if async_epilogue else "false", "smem_bytes": smem, "threads": threads,
              "description": description}
    launch = {"threads": threads, "smem_bytes": smem, "tile_tokens": tile.tile_tokens,
              "block_rows": 64 * nwg * tile.m_tiles, "n": n, "k": k, "experts": shape.experts, "kind": kind,
              "persistent": tile.variant == "ws", "min_blocks": min_blocks, "warpgroups": nwg,
              "combine_top_k": combine_top_k, "row_amax": row_amax, "cluster": cluster}
    return KernelSpec(op="moe_gemm", name=name, template="moe_gemm.cu.jinja", params=params, launch=launch,
                      headers=HEADERS, needs_cutlass=True)


def combine_spec(shape: "ModelShape | MoEDims") -> KernelSpec:
    shape = MoEDims.of(shape)
    return combine_spec_for(shape.hidden, shape.top_k)


COMBINE_MAX_REGISTERS = 128  # moe_combine's register bound per thread (combine_spec_for)


def combine_spec_for(hidden: int, top_k: int) -> KernelSpec:
    """The combine kernel depends on H and k alone (moe_combine's call knows no other dim)."""
    name = kernel_name("moe_combine", "f16pair", "bf16", dims={"h": hidden, "k": top_k})
    # One thread per 16-column block (H / 16), up to 256 per CTA. The bound of COMBINE_MAX_REGISTERS lets ptxas keep
    # every slot's loads of a block in flight at once: without a minimum CTAs per SM it gave the kernel 48 registers
    # and issued each slot's loads only after the previous slot's sum, about one L2 round trip per slot (SASS, nvcc
    # 13.0; at T = 1-8 the combine is that chain of round trips). With it: 105 registers, no spill.
    threads = 128 if hidden // 16 <= 128 else 256
    min_blocks = 65536 // (threads * COMBINE_MAX_REGISTERS)
    params = {"hidden": hidden, "top_k": top_k, "threads": threads, "min_blocks": min_blocks}
    return KernelSpec(op="moe_gemm", name=name, template="moe_combine.cu.jinja", params=params,
                      launch={"threads": threads, "hidden": hidden, "top_k": top_k},
                      headers=HEADERS, needs_cutlass=True)


def specs_for_shape(shape: ModelShape, variants: tuple[str, ...] | None = None) -> list[KernelSpec]:
    """The table kernels of `variants` (default: DEFAULT_VARIANT, what calls use) + the combine.

    profiling/moe_prebuild.py passes every variant to prepare an A/B run.
    """
    for kind in CALL_KINDS:
        n, k = gemm_dims(shape, kind)
        if n % 64 or k % CHUNK_K:  # what gemm_spec checks, said as the shape's terms
            raise UnsupportedShape(f"moe_gemm: hidden ({shape.hidden}) and intermediate ({shape.intermediate}) must be "
                                   f"multiples of 64: each is the N of one GEMM (64-row weight tiles) and the K of the "
                                   f"other ({CHUNK_K}-element K chunks)")
    names = variants or (DEFAULT_VARIANT,)
    specs: dict[str, KernelSpec] = {}  # by name: "auto" reuses the other tables' tiles
    for name in names:
        for kind in CALL_KINDS:
            n, k = gemm_dims(shape, kind)
            tuned = moe_tables.lookup(kind, shape.experts, n, k) if name == "auto" else None
            for limit, tile in tuned or tile_table(name, kind, k):
                if tuned:  # checked when loaded: the tiles run as they are
                    fitted = tile
                elif name in AUTO_TABLES:
                    fitted = auto_fallback(tile, k, limit, n, name)
                else:
                    fitted = fit_chunks(tile, k)
                spec = gemm_spec(shape, launched_kind(kind, fitted), fitted)
                specs.setdefault(spec.name, spec)
    return list(specs.values()) + [combine_spec(shape)]


# The auto tables as TILE_TABLES holds them (no GEMM kind): their v1 ring tiles stepped, auto_ns0 as auto was before
for _name in AUTO_TABLES:
    TILE_TABLES[_name] = tile_table(_name)


OP = OpCodegen(name="moe_gemm", specs_for_shape=specs_for_shape,
               description="NVFP4 MoE grouped GEMMs (swap-AB wgmma, fused SwiGLU-quantize, routed combine)")
