// NVFP4 paged split-KV decode attention, "mma4l": mma2's math with whole pages per CTA and lazy rescaling.
//
// Why: mma2 gives each CTA one kv head, so its loader gathers that head's 64-byte code rows, 8-byte
// block scales and 4-byte row scales from every token of a page (rows Hkv x 64 B apart): twelve
// cp.async per token, each with its page lookup and 64-bit address math, in every thread of the
// tile loop, and the issue rate, not DRAM, is what limits it (docs/kv_cache.md). A page of P tokens
// stores all Hkv heads contiguously ([P, Hkv, D/2] codes, [P, Hkv, D/16] block scales, [P, Hkv] row
// scales), so here one CTA takes every kv head of a (sequence, split) and a tile arrives as six
// bulk copies (TMA, cp.async.bulk) per page run, completing on the stage's mbarrier. The copies are
// spread over the warps (a few lanes each: bulk copies with per-lane operands execute as a loop over
// the lanes, so one loader warp would lag the others by that loop every tile). Each kv head gets
// WARPS_PER_HEAD warps of 32 tokens that run mma2's tile body (decode_attention_mma2_tiles): the
// same operands, MMAs, online softmax and per-head merge, so the results are those of mma2 up to
// the FP32 summation order of the warps' partial sums.
//
// "mma4l_c16" (HEADS_PER_CTA 9..16, GQA groups above 8): two blocks of 8 MMA columns, each dequantized K / V
// fragment feeding both, so the group's q heads read each K/V byte once (mma4l takes such a group in two CTAs, each
// reading and dequantizing every byte). Twice the per-column registers (~180 at D 128: one CTA of 8 warps per SM),
// hence 4 stages by default; the end-of-CTA merge runs once per column block.
//
// Shared memory of a stage: codes [TT][Hkv][D/2], block scales [TT][Hkv][D/16], row scales
// [TT][Hkv], for K and V, as in the cache, then the stage's mbarrier. Runs past the split's end are
// not copied (their page-table entries may be anything); positions past the end inside the last run
// hold whatever the cache holds there, so each warp zeroes its V block scales of those tokens before
// using the tile (a NaN scale times a zero weight would be NaN in P.V; their K scores are masked).
// Each lane reads its page-table entry one tile ahead, so the lookups never stall a warp.
#pragma once

#include <stdint.h>

#include "trace_kernels/attention_decode_mma2.cuh"
#include "trace_kernels/bulk_copy.cuh"

namespace trace_kernels {

// Stage rows: TT tokens x Hkv heads (TT = 32 x WARPS_PER_HEAD), in the cache's order.
template <int D_, int HKV_, int GROUP_, int HEADS_PER_CTA_, int PAGE_, int WARPS_PER_HEAD_, int STAGES_>
struct DecodeAttentionMma4Config : KvStageLayout<32 * WARPS_PER_HEAD_ * HKV_, D_ / 2, D_ / 16, 4> {
  static constexpr bool kNvfp4 = true;
  static constexpr int D = D_;
  static constexpr int HKV = HKV_;
  static constexpr int GROUP = GROUP_;
  static constexpr int G = HEADS_PER_CTA_;  // q heads of each kv head per CTA: MMA columns (<= 16: two n8 blocks)
  static constexpr int kHeadGroups = GROUP / G;
  static constexpr int P = PAGE_;
  static constexpr int kWarpsPerHead = WARPS_PER_HEAD_;
  static constexpr int kKvHeadsPerCta = HKV;
  static constexpr int kWarps = HKV * kWarpsPerHead;
  static constexpr int kTokensPerWarp = 32;
  static constexpr int TT = kWarpsPerHead * kTokensPerWarp;  // token positions per tile (every head)
  static constexpr int STAGES = STAGES_;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kCodeBytes = D / 2;
  static constexpr int kScaleBytes = D / 16;
  static constexpr int kOffBar = DecodeAttentionMma4Config::kLayoutBytes;  // the stage's mbarrier (8 bytes)
  static constexpr int kStageBytes = (kOffBar + 8 + 127) / 128 * 128;
  static constexpr int kRunBytes = 2 * (D / 2 + D / 16 + 4) * HKV;  // per token position, K and V
  static constexpr int kKWords = D / 32;
  static constexpr int kKSteps = D / 16;
  static constexpr int kVWords = D / 64;
  static constexpr int kMTiles = D / 16;
  static constexpr int kReduceFloats = kWarps * (8 * D + 3 * 8);
  static constexpr int kSmemBytes = STAGES * kStageBytes > kReduceFloats * 4 ? STAGES * kStageBytes : kReduceFloats * 4;
  static constexpr bool kDynamicSmem = true;
  static constexpr bool kZeroTailScales = true;
  // Tokens of one page inside a tile (a "run"): whole pages when P <= TT, else a TT-token slice.
  static constexpr int kRun = P < TT ? P : TT;
  static constexpr int kRuns = TT / kRun;
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(G >= 1 && G <= 16 && GROUP % G == 0, "up to 16 q heads per kv head and CTA (two n8 MMA blocks)");
  static_assert(P % 16 == 0 && (TT % P == 0 || P % TT == 0), "pages of 16k tokens, aligned with the tiles");
  static_assert(kThreads <= 1024, "at most 1024 threads per CTA");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per CTA");
  static_assert(kReduceFloats * 4 <= kOffBar, "the final merge reuses stage 0 below its mbarrier");

  // Stage rows in the cache's order (bulk copies cannot permute them): one head's rows are Hkv x D/2
  // bytes apart, so a warp's 16-byte K reads (rows tok, tok + 1 per 8 lanes) are 2-way bank conflicted.
  __device__ static __forceinline__ int code_row(int tok, int h) { return tok * HKV + h; }
  __device__ static __forceinline__ int scale_row(int tok, int h) { return tok * HKV + h; }
  // The bulk-copy pipeline (decode_attention_mma2_tiles calls these when kBulk).
  static constexpr bool kBulk = true;
  __device__ static __forceinline__ void pipeline_start(uint8_t* smem, const DecodeParams& p, int b,
                                                        const SplitRange& r, uint32_t& next_slot);
  __device__ static __forceinline__ void pipeline_next(uint8_t* smem, const DecodeParams& p, int b,
                                                       const SplitRange& r, int tile, uint32_t& next_slot);
};

namespace mma4_detail {

template <class Cfg>
__device__ __forceinline__ uint64_t* full_bar(uint8_t* stage) {
  return reinterpret_cast<uint64_t*>(stage + Cfg::kOffBar);
}

// The tile's 6 x kRuns bulk copies (array c / kRuns of page run c % kRuns) are spread over the CTA:
// copy c is issued by lane c / kWarps of warp c % kWarps, so every warp pays the same few issue
// instructions (bulk copies with per-lane operands run as a loop over the lanes).
template <class Cfg>
__device__ __forceinline__ int copy_of_lane(int warp, int lane) {
  return lane * Cfg::kWarps + warp;
}

// Page slot (page * P + offset) of copy c's run in the tile at pos0, 0 past the end or without a copy.
template <class Cfg>
__device__ __forceinline__ uint32_t copy_slot(const DecodeParams& p, int b, int pos0, int end, int c) {
  const int pos = pos0 + (c % Cfg::kRuns) * Cfg::kRun;
  if (c >= 6 * Cfg::kRuns || pos >= end) return 0u;
  const int* table = p.block_table + static_cast<int64_t>(b) * p.max_pages;
  const uint32_t page = static_cast<uint32_t>(__ldg(table + pos / Cfg::P));
  return page * Cfg::P + static_cast<uint32_t>(pos % Cfg::P);
}

// This warp's share of the tile at pos0 (copy c of this lane; runs at or past the end are skipped,
// the tail fix of decode_attention_mma2_tiles covers their positions): each copying lane adds its
// bytes to the stage mbarrier's expected count, then lane 0 arrives (one arrival per warp).
template <class Cfg>
__device__ __forceinline__ void issue_share(uint8_t* stage, const DecodeParams& p, int pos0, int end, uint32_t slot,
                                            int c, int lane) {
  uint64_t* bar = full_bar<Cfg>(stage);
  const int r = c % Cfg::kRuns;
  if (c < 6 * Cfg::kRuns && pos0 + r * Cfg::kRun < end) {
    const int array = c / Cfg::kRuns;  // K codes, V codes, K block scales, V block scales, K scale, V scale
    const uint8_t* src = array == 0 ? p.k_codes : array == 1 ? p.v_codes : array == 2 ? p.k_block_scales
                       : array == 3 ? p.v_block_scales : array == 4 ? reinterpret_cast<const uint8_t*>(p.k_scale)
                       : reinterpret_cast<const uint8_t*>(p.v_scale);
    const int token_bytes = array < 2 ? Cfg::HKV * Cfg::kCodeBytes : array < 4 ? Cfg::HKV * Cfg::kScaleBytes
                                                                            : Cfg::HKV * 4;
    const int offset = array == 0 ? Cfg::kOffKc : array == 1 ? Cfg::kOffVc : array == 2 ? Cfg::kOffKb
                     : array == 3 ? Cfg::kOffVb : array == 4 ? Cfg::kOffKs : Cfg::kOffVs;
    const uint32_t bytes = static_cast<uint32_t>(Cfg::kRun * token_bytes);
    bulk::mbar_expect_tx(bar, bytes);
    bulk::bulk_copy(stage + offset + r * bytes, src + static_cast<uint64_t>(slot) * token_bytes, bytes, bar);
  }
  __syncwarp();
  if (lane == 0) bulk::mbar_arrive(bar);
}

// Barriers, then tiles 0 .. STAGES - 2 in flight; next_slot = this lane's page slot in tile STAGES - 1.
template <class Cfg>
__device__ __forceinline__ void bulk_start(uint8_t* smem, const DecodeParams& p, int b, const SplitRange& r,
                                           uint32_t& next_slot) {
  static_assert(6 * Cfg::kRuns <= 32 * Cfg::kWarps, "one copy per lane at most");
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < Cfg::STAGES; ++s) bulk::mbar_init(full_bar<Cfg>(smem + s * Cfg::kStageBytes), Cfg::kWarps);
    bulk::fence_mbar_init();
  }
  __syncthreads();
  const int lane = threadIdx.x % 32;
  const int c = copy_of_lane<Cfg>(threadIdx.x / 32, lane);
#pragma unroll
  for (int s = 0; s < Cfg::STAGES - 1; ++s) {
    if (s < r.num_tiles) {
      const int pos0 = r.pos_begin + s * Cfg::TT;
      issue_share<Cfg>(smem + s * Cfg::kStageBytes, p, pos0, r.pos_end, copy_slot<Cfg>(p, b, pos0, r.pos_end, c), c,
                       lane);
    }
  }
  if (Cfg::STAGES - 1 < r.num_tiles)
    next_slot = copy_slot<Cfg>(p, b, r.pos_begin + (Cfg::STAGES - 1) * Cfg::TT, r.pos_end, c);
}

// At the top of iteration `tile` (the CTA barrier ending tile - 1 freed its stage): every warp issues
// its share of tile n = tile + STAGES - 1 into that stage and reads its page slot of tile n + 1 (used
// one tile later, so the lookup never stalls); then every thread waits for `tile`.
template <class Cfg>
__device__ __forceinline__ void bulk_next(uint8_t* smem, const DecodeParams& p, int b, const SplitRange& r, int tile,
                                          uint32_t& next_slot) {
  const int n = tile + Cfg::STAGES - 1;
  if (n < r.num_tiles) {
    const int lane = threadIdx.x % 32;
    const int c = copy_of_lane<Cfg>(threadIdx.x / 32, lane);
    const int pos0 = r.pos_begin + n * Cfg::TT;
    issue_share<Cfg>(smem + (n % Cfg::STAGES) * Cfg::kStageBytes, p, pos0, r.pos_end, next_slot, c, lane);
    if (n + 1 < r.num_tiles) next_slot = copy_slot<Cfg>(p, b, pos0 + Cfg::TT, r.pos_end, c);
  }
  bulk::mbar_wait(full_bar<Cfg>(smem + (tile % Cfg::STAGES) * Cfg::kStageBytes),
                  static_cast<uint32_t>(tile / Cfg::STAGES) & 1u);
}

}  // namespace mma4_detail

template <int D_, int HKV_, int GROUP_, int HEADS_PER_CTA_, int PAGE_, int WARPS_PER_HEAD_, int STAGES_>
__device__ __forceinline__ void DecodeAttentionMma4Config<D_, HKV_, GROUP_, HEADS_PER_CTA_, PAGE_, WARPS_PER_HEAD_,
                                                          STAGES_>::pipeline_start(uint8_t* smem, const DecodeParams& p,
                                                                                   int b, const SplitRange& r,
                                                                                   uint32_t& next_slot) {
  mma4_detail::bulk_start<DecodeAttentionMma4Config>(smem, p, b, r, next_slot);
}

template <int D_, int HKV_, int GROUP_, int HEADS_PER_CTA_, int PAGE_, int WARPS_PER_HEAD_, int STAGES_>
__device__ __forceinline__ void DecodeAttentionMma4Config<D_, HKV_, GROUP_, HEADS_PER_CTA_, PAGE_, WARPS_PER_HEAD_,
                                                          STAGES_>::pipeline_next(uint8_t* smem, const DecodeParams& p,
                                                                                  int b, const SplitRange& r, int tile,
                                                                                  uint32_t& next_slot) {
  mma4_detail::bulk_next<DecodeAttentionMma4Config>(smem, p, b, r, tile, next_slot);
}

// LoadTile of decode_attention_mma2_tiles: unused with kBulk (the pipeline above loads the stages).
template <class Cfg>
__device__ __forceinline__ void load_tile_unused(uint8_t*, const DecodeParams&, int, int, int, int) {}

// kLean: lazy rescaling (attention_decode_mma2.cuh, kLazyLog2), 2-3% faster than eager at L >= 32K on the H200; the
// template ("mma4l") always passes true. The parameter stays so that profiling/decode_ab.py can build this tree's
// template against older header trees, whose kernel takes it.
template <class Cfg, bool kLean>
__device__ __forceinline__ void decode_attention_mma4(const DecodeParams& p) {
  decode_attention_mma2_tiles<Cfg, load_tile_unused<Cfg>, kLean>(p);
}

}  // namespace trace_kernels
