// NVFP4 paged split-KV decode attention, "mma3": the math of "mma2" (tokens as MMA rows,
// attention_decode_mma2.cuh) with a cheaper tile loader and lazy softmax rescaling.
//
// Why: in mma2's tile loop (static SASS, D = 128, GQA 8, nvcc 13.0) ~220 of the 1048 instructions
// per thread and 64-token tile are the loader's: a page lookup (signed division, 64-bit row
// arithmetic, one block-table load) for every 16-byte chunk a thread copies. Here thread t copies
// all of token t (TT == threads): one lookup, one 64-bit row, the chunks as immediate offsets
// (~64 instructions). And the running maxima move only when a tile's max exceeds them by more than
// 2^8 (kLean in decode_attention_mma2_tiles, which also takes one log2
// of the V row scale per token instead of four), so most tiles skip the alpha / beta
// exponentials and the rescale of the accumulators. Together: ~880 executed instructions per
// thread and tile, ~27.5 warp instructions per (token, kv head), against ~32.7 for mma2 and ~105
// for mma. What is left is mostly dequantization (~15 per token: 7 integer ops, 4 conversions and
// 4 HMUL2 per 8 codes), which no layout change here removes.
#pragma once

#include <stdint.h>

#include "trace_kernels/attention_decode_mma2.cuh"

namespace trace_kernels {

// Thread t copies token t of the tile (TT == kThreads): its K and V code rows (D/32 16-byte
// chunks each, as immediate offsets from one address) and its four scales, after one page lookup.
// Per 16-byte copy instruction a warp then touches half of 32 sectors; the other half follows in
// the next instruction and hits L2, so DRAM traffic is the same as with 4 threads per row.
template <class Cfg>
__device__ __forceinline__ void load_tile_rows(uint8_t* stage, const DecodeParams& p, int b, int kv_head, int pos0,
                                               int end) {
  static_assert(Cfg::TT == Cfg::kThreads, "one token per thread");
  constexpr int kChunks = Cfg::kCodeBytes / 16;
  constexpr int kSb = Cfg::kScaleBytes;
  const int t = threadIdx.x;
  const uint32_t pos = static_cast<uint32_t>(pos0 + t);
  const bool valid = static_cast<int>(pos) < end;
  const int page = valid ? __ldg(p.block_table + static_cast<int64_t>(b) * p.max_pages + pos / Cfg::P) : 0;
  const int64_t row = static_cast<int64_t>(page) * (Cfg::P * Cfg::HKV) + ((pos % Cfg::P) * Cfg::HKV + kv_head);
  const uint8_t* k_src = p.k_codes + row * Cfg::kCodeBytes;
  const uint8_t* v_src = p.v_codes + row * Cfg::kCodeBytes;
  const int bytes = valid ? 16 : 0;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    detail::cp_async16(stage + Cfg::kOffKc + t * Cfg::kCodeBytes + 16 * c, k_src + 16 * c, bytes);
    detail::cp_async16(stage + Cfg::kOffVc + t * Cfg::kCodeBytes + 16 * c, v_src + 16 * c, bytes);
  }
  detail::cp_async_small<kSb>(stage + Cfg::kOffKb + t * kSb, p.k_block_scales + row * kSb, valid ? kSb : 0);
  detail::cp_async_small<kSb>(stage + Cfg::kOffVb + t * kSb, p.v_block_scales + row * kSb, valid ? kSb : 0);
  detail::cp_async_small<4>(stage + Cfg::kOffKs + t * 4, p.k_scale + row, valid ? 4 : 0);
  detail::cp_async_small<4>(stage + Cfg::kOffVs + t * 4, p.v_scale + row, valid ? 4 : 0);
}

template <class Cfg>
__device__ __forceinline__ void decode_attention_mma3(const DecodeParams& p) {
  decode_attention_mma2_tiles<Cfg, load_tile_rows<Cfg>, /*kLean=*/true>(p);
}

}  // namespace trace_kernels
