// NVFP4 MoE grouped GEMM, warp-specialized persistent variant ("ws"; moe_gemm.cuh is "v1").
//
// Same semantics and the same arithmetic as moe_gemm.cuh: the A registers hold the same exact BF16
// products value(code) * block scale * 2^-7 (moe_dequant.cuh), and the same wgmma.m64nTNk16 sequence runs in the same k order
// into the same accumulators, so every output is bitwise identical to v1's (tested).
// What differs is how the bytes arrive and how the work is scheduled:
//   * persistent CTAs walk the (token tile, weight tile) items item = y * XT + wt, y-major, in steps
//     of gridDim.x (the host sizes the grid to the SMs x occupancy);
//   * a producer warpgroup (the last; setmaxnreg gives its registers to the consumers) fills a
//     STAGES-deep ring of CPS K-chunks of 64 per stage; its first thread issues the weight copies, and
//     all four warps (only the first with ASYNC_EPI, whose epilogue takes the other three) gather the
//     activation rows, so a 128-token stage costs each gathering thread 8 cp.async, not 32:
//     the fragment-ordered weight records with cp.async.bulk (async proxy, mbarrier complete_tx,
//     one instruction per warpgroup per record kind), the gathered activation rows with cp.async whose
//     completion the same mbarrier tracks (cp.async.mbarrier.arrive), as CUTLASS's
//     cp.async + GMMA warp-specialized mainloop does: no CTA barrier and no fence.proxy.async
//     (MEMBAR) per iteration;
//   * consumer warpgroups wait on full[s], dequantize, issue wgmma, and release the stage on empty[s]
//     once their wgmmas that read it have completed; they never wait for each other in the main
//     loop, so one warpgroup's dequantization overlaps the other's tensor-core work;
//   * ASYNC_EPI (fused SwiGLU epilogue only): the per-item tile counter (an acq_rel atomic) and the
//     last CTA's row quantization run on the producer warpgroup's three spare warps, handed each
//     item's h through an mbarrier, so the consumers go straight on to the next item (same stores,
//     same quantize_rows_nvfp4 arithmetic: outputs unchanged);
//   * ROW_AMAX (fused SwiGLU epilogue only): every CTA folds its part of each row's amax into row_amax, and the last
//     CTA quantizes each (row, block of 16) on its own thread with one L2 round trip (moe_nvfp4_row.cuh).
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "trace_kernels/bulk_copy.cuh"
#include "trace_kernels/moe_gemm.cuh"
#include "trace_kernels/pdl.cuh"
#include "trace_kernels/tile_arrival.cuh"

namespace trace_kernels::moe {

namespace ws {

using bulk::bulk_copy;  // mbarrier and bulk-copy helpers (bulk_copy.cuh)
using bulk::cp_async_track;
using bulk::mbar_arrive;
using bulk::mbar_arrive_expect_tx;
using bulk::mbar_init;
using bulk::mbar_wait;
using bulk::smem_addr;

// Barrier among the consumer warpgroups only (id 1; 0 is __syncthreads).
template <int THREADS>
__device__ __forceinline__ void consumer_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(THREADS) : "memory"); }
// Barrier among the three epilogue warps of ASYNC_EPI (id 2).
__device__ __forceinline__ void epilogue_sync() { asm volatile("bar.sync 2, 96;\n" ::: "memory"); }
// Barrier among the producer's gathering warps (id 3): they share the item's source-row table.
template <int THREADS>
__device__ __forceinline__ void gather_sync() {
  if constexpr (THREADS == 32) __syncwarp();
  else asm volatile("bar.sync 3, %0;\n" ::"n"(THREADS) : "memory");
}

}  // namespace ws

// Shared-memory plan of the ws kernel (mirrored by codegen.ops.moe_gemm.smem_bytes): barriers and
// per-item tables at fixed offsets from the start of dynamic shared memory; the ring starts at the
// next 1024-byte boundary (SW128 atoms).
template <int TN, int NWG, int STAGES, int CPS, int MT = 1, bool ASYNC_EPI = false>
struct MoEWsSmem {
  static constexpr int kBars = 0;  // uint64 full[STAGES], empty[STAGES], tok_free[2] (+ h_done[2], epi_free[2])
  static constexpr int kTokens = kBars + (2 * STAGES + 2 + (ASYNC_EPI ? 4 : 0)) * 8;  // float [2][2][TN]: token scale, router weight
  static constexpr int kSrcRows = kTokens + 2 * 2 * TN * 4;              // int32 [TN] (producer warp only)
  static constexpr int kFlag = kSrcRows + TN * 4;                        // int32 [4]
  static constexpr int kTileStart = kFlag + 16;                          // int32 [E+1]
  static constexpr int header(int num_experts) { return kTileStart + (num_experts + 1) * 4; }
  // ring, relative to its 1024-aligned start
  static constexpr int kBSub = TN * detail::kChunkK * 2;                 // one K chunk of activations
  static constexpr int kBStage = CPS * kBSub;
  static constexpr int kCodesStage = NWG * MT * CPS * detail::kCodeRecord;   // [NWG*MT][CPS][2048]
  static constexpr int kScalesStage = NWG * MT * CPS * detail::kScaleRecord; // [NWG*MT][CPS][256]
  static constexpr int kB = 0;
  static constexpr int kCodes = kB + STAGES * kBStage;
  static constexpr int kScales = kCodes + STAGES * kCodesStage;
  static constexpr int kRing = kScales + STAGES * kScalesStage;
  static constexpr int bytes(int num_experts) { return header(num_experts) + 1024 + kRing; }
};

// Registers per thread after setmaxnreg. A CTA's register pool is fixed at launch: (NWG + 1) * 128
// threads times the count ptxas gives the kernel, which with setmaxnreg is the launch-bounds cap
// (65536 / threads / MIN_BLOCKS, rounded down to 8). The producer warpgroup shrinks to kProducerRegs,
// the consumers grow into the rest; asking for more than the pool would hang setmaxnreg.inc, so the
// host checks the cubin's register count against ws_register_split (codegen.ops.moe_gemm).
constexpr int kProducerRegs = 64;
template <int NWG, int MIN_BLOCKS>
constexpr int entry_regs() {
  const int r = 65536 / (128 * (NWG + 1) * MIN_BLOCKS) / 8 * 8;
  return r > 255 ? 248 : r;
}
template <int NWG, int MIN_BLOCKS>
constexpr int consumer_regs() {
  const int r = ((NWG + 1) * entry_regs<NWG, MIN_BLOCKS>() - kProducerRegs) / NWG / 8 * 8;
  return r > 240 ? 240 : r;
}

// MT: 64-row weight tiles per consumer warpgroup (MT = 2: 128 rows per warpgroup, so each activation
// byte read from L2 feeds twice the MMAs; the second tile's dequantization overlaps the first's wgmmas).
// ASYNC_EPI: the fused epilogue's counter and last-CTA quantization on the producer's spare warps.
template <int E, int N, int K, int TN, int NWG, int STAGES, int CPS, Epilogue EPI, int SMEM_BYTES, bool OVERLAP,
          int MIN_BLOCKS, int MT = 1, bool ASYNC_EPI = false, bool ROW_AMAX = false>
__device__ __forceinline__ void moe_gemm_ws_device(const MoEGemmParams& p) {
  using namespace cute;
  using Smem = MoEWsSmem<TN, NWG, STAGES, CPS, MT, ASYNC_EPI>;
  constexpr int kConsumers = NWG * 128;  // threads; the producer warpgroup's 128 follow them
  constexpr int kGatherers = ASYNC_EPI ? 32 : 128;  // producer threads that gather activation rows
  constexpr int kConsumerRegs = consumer_regs<NWG, MIN_BLOCKS>();
  static_assert(kConsumerRegs >= 64 && kConsumerRegs >= entry_regs<NWG, MIN_BLOCKS>(),
                "too many CTAs per SM for the consumer registers");
  constexpr int kBlockRows = 64 * NWG * MT;
  constexpr int kRowTiles = N / 64;
  constexpr int kXTiles = N / kBlockRows;
  constexpr int kChunks = K / detail::kChunkK;
  constexpr int kStageIters = kChunks / CPS;  // ring iterations per item
  constexpr uint32_t kTxBytes = NWG * MT * CPS * (detail::kCodeRecord + detail::kScaleRecord);
  static_assert(N % kBlockRows == 0 && K % (detail::kChunkK * CPS) == 0, "N % (64*NWG*MT) and K % (64*CPS) must be 0");
  static_assert(MT == 1 || MT == 2, "MT in {1, 2}");
  static_assert(!(OVERLAP && MT > 1), "MT = 2 overlaps within the stage instead");
  static_assert(TN % 8 == 0 && TN >= 8 && TN <= 256, "wgmma N is 8..256 in steps of 8");
  static_assert(STAGES >= 2 && (CPS == 1 || CPS == 2), "STAGES >= 2, CPS in {1, 2}");
  static_assert(!OVERLAP || kStageIters % 2 == 0, "OVERLAP alternates two A buffers: even number of stages per item");
  static_assert(Smem::bytes(E) <= SMEM_BYTES, "generator's shared-memory size is too small");
  static_assert((EPI != Epilogue::SwigluQuant && EPI != Epilogue::Swiglu) || (N % 32 == 0), "SwiGLU needs 2I % 32 == 0");
  static_assert(!ASYNC_EPI || EPI == Epilogue::SwigluQuant, "ASYNC_EPI is a fused-SwiGLU-epilogue option");

  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint64_t* full_bar = reinterpret_cast<uint64_t*>(smem_raw + Smem::kBars);
  uint64_t* empty_bar = full_bar + STAGES;
  uint64_t* tok_free = empty_bar + STAGES;  // [2]: consumers are done with a token-scale slot
  uint64_t* h_done = tok_free + 2;          // [2] ASYNC_EPI: consumers stored an item's h (slot = item parity)
  uint64_t* epi_free = h_done + 2;          // [2] ASYNC_EPI: the epilogue warps are done with that slot
  float* tok = reinterpret_cast<float*>(smem_raw + Smem::kTokens);  // [slot][scale | weight][TN]
  int32_t* src_rows = reinterpret_cast<int32_t*>(smem_raw + Smem::kSrcRows);
  int32_t* flag = reinterpret_cast<int32_t*>(smem_raw + Smem::kFlag);
  int32_t* tile_start = reinterpret_cast<int32_t*>(smem_raw + Smem::kTileStart);  // [E+1]
  // the ring: next 1024-byte boundary after the header (offsetting smem_raw keeps LDS addressing)
  const uint32_t ring_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) + Smem::header(E);
  uint8_t* smem = smem_raw + Smem::header(E) + ((1024u - (ring_base & 1023u)) & 1023u);

  const int tid = threadIdx.x;
  const int lane = tid % 32;

  // ---- tile scan, barriers (all threads, once per persistent CTA) ----
  if (tid < 32) scan_expert_tiles<E, TN>(p.offsets, tile_start, tid);
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      ws::mbar_init(&full_bar[s], kGatherers + 1);  // every gathering thread + thread 0's expect_tx
      ws::mbar_init(&empty_bar[s], kConsumers);     // every consumer thread releases
    }
    ws::mbar_init(&tok_free[0], kConsumers);
    ws::mbar_init(&tok_free[1], kConsumers);
    if constexpr (ASYNC_EPI) {
      for (int s = 0; s < 2; ++s) {
        ws::mbar_init(&h_done[s], kConsumers);
        ws::mbar_init(&epi_free[s], 96);
      }
    }
  }
  __syncthreads();
  // Everything below may read the previous kernel's outputs (pdl.cuh); the scan above reads only the
  // offsets, which come from before it.
  pdl::wait_for_prerequisite_grid();
  pdl::allow_dependent_launch();
  // (read after setmaxnreg in each role: a value live across it is spilled)
  auto items = [&]() { return tile_start[E] * kXTiles; };

  // item -> (expert, first sorted row, valid rows, weight tile); expert by binary search of tile_start
  auto decode = [&](int item, int& expert, int& row0, int& rows_valid, int& wt, int& y_tile) {
    y_tile = item / kXTiles;
    wt = item - y_tile * kXTiles;
    int lo = 0, hi = E;  // largest e with tile_start[e] <= y_tile (empty experts share starts: take the last)
    while (hi - lo > 1) {
      const int mid = (lo + hi) >> 1;
      if (tile_start[mid] <= y_tile) lo = mid; else hi = mid;
    }
    expert = lo;
    row0 = p.offsets[expert] + (y_tile - tile_start[expert]) * TN;
    rows_valid = min(TN, p.offsets[expert + 1] - row0);
  };

  using SmemLayoutB = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<bfloat16_t>{},
                                             make_shape(Int<TN>{}, Int<detail::kChunkK>{}, Int<STAGES * CPS>{})));

  if (tid >= kConsumers) {
    // ============ producer warpgroup: thread 0 issues the weight copies, warps gather rows ============
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    if constexpr (ASYNC_EPI) {
      if (tid >= kConsumers + 32) {
        // ---- epilogue warps (1..3 of this warpgroup): per item, once the consumers' h stores are
        // published on h_done (mbarrier release/acquire, CTA scope), count the token tile at GPU scope
        // (tile_arrival.cuh: one thread's acq_rel atomic, cumulative over what that thread observed); the
        // last CTA quantizes the tile's complete rows, 3 warps x rows.
        const int etid = tid - (kConsumers + 32);  // 0..95
        const int num_items = items();
        int local = 0;
        for (int item = blockIdx.x; item < num_items; item += gridDim.x, ++local) {
          const int slot = local & 1;
          ws::mbar_wait(&h_done[slot], (local >> 1) & 1);
          int expert, row0, rows_valid, wt, y_tile;
          decode(item, expert, row0, rows_valid, wt, y_tile);
          if (etid == 0) flag[1] = (arrive_acq_rel_gpu(&p.tile_counters[y_tile]) == kXTiles - 1);
          ws::epilogue_sync();
          const bool last = flag[1];
          if (last) {
            if (etid == 0) p.tile_counters[y_tile] = 0;  // ready for the next launch
            if constexpr (ROW_AMAX) {
              quantize_rows_nvfp4_from_amax<N / 2, 96>(p.out, row0, rows_valid, etid, p.row_amax, p.q_codes,
                                                       p.q_block_scales, p.q_scale, p.q_dequant, p.q_mantissa_bits,
                                                       p.status);
            } else {
              quantize_rows_nvfp4<N / 2, false, 3>(p.out, row0, rows_valid, etid / 32, lane, p.q_codes,
                                                   p.q_block_scales, p.q_scale, p.q_dequant, p.q_mantissa_bits,
                                                   p.status);
            }
          }
          ws::epilogue_sync();  // flag[1] is rewritten by the next item; every row_amax read
          if constexpr (ROW_AMAX) {
            if (last) clear_row_amax<96>(p.row_amax, row0, rows_valid, etid);
          }
          ws::mbar_arrive(&epi_free[slot]);
        }
        return;
      }
    }
    const int ptid = tid - kConsumers;  // 0 .. kGatherers-1
    const int num_items = items();
    int it = 0, local = 0;
    for (int item = blockIdx.x; item < num_items; item += gridDim.x, ++local) {
      int expert, row0, rows_valid, wt, y_tile;
      decode(item, expert, row0, rows_valid, wt, y_tile);
      // The token rows in two halves, as v1's (moe_gemm_device): the source rows now, which the activation copies
      // need, and the activation row scales s_a and router weights, which only the consumers' epilogue reads, stored
      // into slot local & 1 once the item's first stage is issued, so the first activation copies wait for no round
      // trip of theirs (the gate_up's row scale, the down GEMM's scales and weights); the consumers multiply s_a by s_w.
      // Published by these threads' arrivals on the item's first full barrier (release), read by the consumers after
      // their wait on it (acquire).
      const int slot = local & 1;
      ws::mbar_wait(&tok_free[slot], ((local >> 1) & 1) ^ 1);
      ws::gather_sync<kGatherers>();  // every gatherer is done with the previous item's src_rows
      constexpr int kHeldRows = (TN + kGatherers - 1) / kGatherers;
      TokenRowLoads held_rows[kHeldRows];
      request_token_rows<TN, kHeldRows, EPI>(p, row0, rows_valid, ptid, kGatherers, src_rows, held_rows);
      ws::gather_sync<kGatherers>();
      const size_t record = (static_cast<size_t>(expert) * kRowTiles + wt * NWG * MT) * kChunks;  // (tile, chunk 0)
      const int c = ptid & 7;  // this thread's 16-byte column piece of every activation row
      for (int ks = 0; ks < kStageIters; ++ks, ++it) {
        const int s = it % STAGES;
        ws::mbar_wait(&empty_bar[s], ((it / STAGES) & 1) ^ 1);
        if (ptid == 0) {
          ws::mbar_arrive_expect_tx(&full_bar[s], kTxBytes);
#pragma unroll
          for (int w = 0; w < NWG * MT; ++w) {  // record group w = warpgroup * MT + m tile
            const size_t rec = record + static_cast<size_t>(w) * kChunks + ks * CPS;  // CPS records are contiguous
            ws::bulk_copy(smem + Smem::kCodes + s * Smem::kCodesStage + w * CPS * detail::kCodeRecord,
                          p.w_codes + rec * detail::kCodeRecord, CPS * detail::kCodeRecord, &full_bar[s]);
            ws::bulk_copy(smem + Smem::kScales + s * Smem::kScalesStage + w * CPS * detail::kScaleRecord,
                          p.w_scales + rec * detail::kScaleRecord, CPS * detail::kScaleRecord, &full_bar[s]);
          }
        }
#pragma unroll
        for (int sub = 0; sub < CPS; ++sub) {
          const int chunk = ks * CPS + sub;
          uint8_t* dst = smem + Smem::kB + (s * CPS + sub) * Smem::kBSub;
          // rows n = ptid/8 + (kGatherers/8) j; same address as &sB(n, 8c, s*CPS+sub) (closed-form SW128, as v1)
          for (int n = ptid >> 3; n < TN; n += kGatherers / 8) {
            const int src = src_rows[n];
            const __nv_bfloat16* g =
                p.a + (static_cast<size_t>(src < 0 ? 0 : src) * K + chunk * detail::kChunkK + c * 8);
            detail::cp_async_16(dst + n * 128 + ((c ^ (n & 7)) << 4), g, src >= 0);
          }
        }
        if (ks == 0) {  // the first stage is in flight: the epilogue's s_a and router weights (see above)
#pragma unroll
          for (int i = 0; i < kHeldRows; ++i) {
            const int n = ptid + i * kGatherers;
            if (n < TN) store_token_row(held_rows[i], n, tok + (2 * slot) * TN, tok + (2 * slot + 1) * TN);
          }
        }
        ws::cp_async_track(&full_bar[s]);  // the phase waits for this thread's cp.asyncs ...
        ws::mbar_arrive(&full_bar[s]);     // ... and counts this thread once
      }
    }
    return;
  }

  // ================= consumer warpgroups =================
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
  const int num_items = items();
  const int wg = tid / 128;
  const int warp_in_wg = (tid % 128) / 32;
  const int g = lane / 4;
  using MmaOp = decltype(SM90::GMMA::rs_op_selector<bfloat16_t, bfloat16_t, float, Shape<_64, Int<TN>, _16>>());
  TiledMMA tiled_mma = make_tiled_mma(MmaOp{});
  auto thr_mma = tiled_mma.get_thread_slice(tid % 128);
  using SmemLayoutA = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<bfloat16_t>{},
                                             make_shape(Int<64 * MT>{}, Int<detail::kChunkK * CPS>{})));
  bfloat16_t* smem_b = reinterpret_cast<bfloat16_t*>(smem + Smem::kB);
  Tensor sB = make_tensor(make_smem_ptr(smem_b), SmemLayoutB{});               // (TN, 64, STAGES*CPS)
  Tensor sA_shape = make_tensor(make_smem_ptr(smem_b), SmemLayoutA{});         // (64*MT, 64*CPS): shape only
  Tensor tCsB = thr_mma.partition_B(sB);                                       // (MMA, 1, 4, STAGES*CPS)
  Tensor tCrB = thr_mma.make_fragment_B(tCsB);                                 // descriptors
  Tensor tCrA = thr_mma.partition_fragment_A(sA_shape);                        // (MMA, MT, 4*CPS) bf16 regs
  Tensor tCrA_next = make_fragment_like(tCrA);                                 // OVERLAP's second buffer
  Tensor accum = partition_fragment_C(tiled_mma, Shape<Int<64 * MT>, Int<TN>>{});  // ((2,2,TN/8), MT, 1)
  static_assert(size<1>(tCrA) == MT && size<2>(tCrA) == 4 * CPS && size(accum) == MT * TN / 2,
                "unexpected wgmma fragment shapes");

  // dequantize stage s (MT x CPS records of this warpgroup) into frag_a, issue its wgmmas
  auto stage_mma = [&](const int s, auto& frag_a) {
    auto a_u32 = recast<uint32_t>(frag_a);  // (4 regs, MT, 4*CPS)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int sub = 0; sub < CPS; ++sub) {
        const int rec = (wg * MT + mt) * CPS + sub;  // record of this warpgroup's m tile mt, K chunk sub
        const uint4 codes = *reinterpret_cast<const uint4*>(smem + Smem::kCodes + s * Smem::kCodesStage +
                                                            rec * detail::kCodeRecord + (tid % 128) * 16);
        const uint2 scales = *reinterpret_cast<const uint2*>(smem + Smem::kScales + s * Smem::kScalesStage +
                                                             rec * detail::kScaleRecord + (warp_in_wg * 8 + g) * 8);
        const uint32_t code_words[4] = {codes.x, codes.y, codes.z, codes.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {  // a0: row r, a1: row r+8, a2: row r k+8, a3: row r+8 k+8
          uint32_t regs[4];
          dequant::dequant_step(code_words[j], dequant::scale_pair(j < 2 ? scales.x : scales.y, j), regs);
#pragma unroll
          for (int b = 0; b < 4; ++b) a_u32(b, mt, sub * 4 + j) = regs[b];
        }
      }
      // issue m tile mt now: its wgmmas run while the next m tile is dequantized
      warpgroup_fence_operand(accum);
      warpgroup_arrive();
#pragma unroll
      for (int sub = 0; sub < CPS; ++sub)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          cute::gemm(tiled_mma, frag_a(_, mt, sub * 4 + j), tCrB(_, 0, j, s * CPS + sub), accum(_, mt, 0));
    }
    warpgroup_commit_batch();
  };

  int it = 0, local = 0;
  for (int item = blockIdx.x; item < num_items; item += gridDim.x, ++local) {
    int expert, row0, rows_valid, wt, y_tile;
    decode(item, expert, row0, rows_valid, wt, y_tile);
    const float* tok_scale = tok + (2 * (local & 1)) * TN;   // s_a, written by the producer for this item
    const float* tok_weight = tok_scale + TN;
    const float s_w = p.w_scale[expert] * dequant::kWeightScaleFold;  // times tok_scale in the epilogue
    clear(accum);
    if constexpr (OVERLAP) {
      // wgmmas of stage it stay in flight while stage it+1 is dequantized into the other A buffer;
      // a stage is released once the wgmma.wait after the next stage's issue has retired its reads.
      for (int ks = 0; ks < kStageIters; ks += 2) {
#pragma unroll
        for (int half = 0; half < 2; ++half, ++it) {
          const int s = it % STAGES;
          ws::mbar_wait(&full_bar[s], (it / STAGES) & 1);
          if (half == 0) stage_mma(s, tCrA); else stage_mma(s, tCrA_next);
          warpgroup_wait<1>();
          warpgroup_fence_operand(accum);
          if (ks + half > 0) ws::mbar_arrive(&empty_bar[(it - 1) % STAGES]);
        }
      }
      warpgroup_wait<0>();
      warpgroup_fence_operand(accum);
      ws::mbar_arrive(&empty_bar[(it - 1) % STAGES]);
    } else {
      for (int ks = 0; ks < kStageIters; ++ks, ++it) {
        const int s = it % STAGES;
        ws::mbar_wait(&full_bar[s], (it / STAGES) & 1);
        stage_mma(s, tCrA);
        warpgroup_wait<0>();
        warpgroup_fence_operand(accum);
        ws::mbar_arrive(&empty_bar[s]);
      }
    }

    // ---- epilogue (v1's store_warp_tile; token scales from the producer's slot) ----
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      detail::store_warp_tile<N, TN, EPI, ROW_AMAX>(p, [&](int j) { return accum(j, mt, 0); }, tok_scale, tok_weight,
                                                    wt * kBlockRows + (wg * MT + mt) * 64 + warp_in_wg * 16, row0,
                                                    rows_valid, lane, p.row_amax, row0, s_w);
    }
    ws::mbar_arrive(&tok_free[local & 1]);  // this thread is done with the slot
    if constexpr (ASYNC_EPI) {
      // hand this item's h to the epilogue warps (slot free once they finished item local - 2)
      ws::mbar_wait(&epi_free[local & 1], ((local >> 1) & 1) ^ 1);
      ws::mbar_arrive(&h_done[local & 1]);  // release: this thread's h stores
    } else if constexpr (EPI == Epilogue::SwigluQuant) {
      // the last CTA to finish token tile y_tile quantizes its complete rows of h (order-independent)
      ws::consumer_sync<kConsumers>();  // orders the consumers' h stores before thread 0's acq_rel arrival
      if (tid == 0) flag[0] = (arrive_acq_rel_gpu(&p.tile_counters[y_tile]) == kXTiles - 1);
      ws::consumer_sync<kConsumers>();
      const bool last = flag[0];
      if (last) {
        if (tid == 0) p.tile_counters[y_tile] = 0;  // ready for the next launch
        if constexpr (ROW_AMAX) {
          constexpr int kBatch = TN >= 64 ? 4 : 1;  // blocks per thread in flight (a decode tile has one or two)
          quantize_rows_nvfp4_from_amax<N / 2, kConsumers, kBatch>(p.out, row0, rows_valid, tid, p.row_amax,
                                                                   p.q_codes, p.q_block_scales, p.q_scale, p.q_dequant,
                                                                   p.q_mantissa_bits, p.status);
        } else {
          // Rows held in registers (WIDE, one L2 read per row instead of two) also at one consumer warpgroup's decode
          // TN (auto's tile at T <= 2) where a row has more than 64 blocks (a warp per row): Qwen3-235B-A22B's fused
          // gate_up 1-2% faster at T = 1-2 (fortieth session, H100). Not at 64 blocks or fewer (a half warp per row,
          // e.g. 30B's 48), where the held path's 2.3x epilogue code was 0-1% slower and 2.6 us slower in a cold-cache
          // launch; nor at two warpgroups' TN=32 (an extra tile), which would spill.
          constexpr bool kHoldRows = TN >= 64 || (NWG == 1 && held_row_takes_a_warp<N / 2>());
          quantize_rows_nvfp4<N / 2, kHoldRows, kConsumers / 32>(p.out, row0, rows_valid, tid / 32, lane, p.q_codes,
                                                                 p.q_block_scales, p.q_scale, p.q_dequant,
                                                                 p.q_mantissa_bits, p.status);
        }
      }
      ws::consumer_sync<kConsumers>();  // flag[0] is rewritten by the next item; every row_amax read
      if constexpr (ROW_AMAX) {
        if (last) clear_row_amax<kConsumers>(p.row_amax, row0, rows_valid, tid);
      }
    }
  }
}

}  // namespace trace_kernels::moe
