// KV append: K and V rows (BF16 [T, Hkv, D], after RoPE / k-norm) -> paged cache through a slot
// mapping (flat slot = page * P + offset). NVFP4 pages are quantized per (token, kv head) row
// exactly as trace_kernels.nvfp4.quantize(x, scale="row") (quantize_epilogue.cuh: the packed
// 16-bit block path, branch-free for rows with row_scale_fast), and the compact TRACE guidance of what was written can be emitted in
// token order. BF16 pages get a plain scatter copy. Layout: docs/kv_cache.md.
//
// Work split (NVFP4): BLOCKS_PER_THREAD consecutive 16-element blocks per thread (1 by default;
// variant "b2": 2, i.e. twice the loads in flight and half the row-level work per block),
// D/16/BLOCKS_PER_THREAD consecutive threads own one row, so a block amax is thread-local and the
// row amax a shuffle tree inside the row group. blockIdx.y picks K (0) or V (1). The page position
// depends only on the slot, not on the page size.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "trace_kernels/kv_codes.cuh"
#include "trace_kernels/kv_pages.cuh"
#include "trace_kernels/nvfp4.cuh"
#include "trace_kernels/quantize_epilogue.cuh"
#include "trace_kernels/status.cuh"
#include "trace_kernels/vec.cuh"

namespace trace_kernels {

template <int D_, int HKV_, int CTA_, int BLOCKS_PER_THREAD_ = 1>
struct KvAppendNvfp4Config {
  static constexpr int D = D_;
  static constexpr int HKV = HKV_;
  static constexpr int CTA = CTA_;
  static constexpr int kBlocksPerThread = BLOCKS_PER_THREAD_;
  static constexpr int kThreadsPerRow = D / nvfp4::kBlock / kBlocksPerThread;
  static constexpr int kRowsPerCta = CTA / kThreadsPerRow;
  static_assert(D % (nvfp4::kBlock * kBlocksPerThread) == 0, "D must be a multiple of 16 x blocks per thread");
  static_assert(kThreadsPerRow <= 32 && (kThreadsPerRow & (kThreadsPerRow - 1)) == 0,
                "D / 16 must be a power of two <= 32 (row group inside one warp)");
  static_assert(CTA % 32 == 0 && CTA % kThreadsPerRow == 0 && CTA <= 1024, "CTA must hold whole warps");
};

struct GuidancePtrs {  // all null: no guidance
  float* scale;            // [T, Hkv]
  uint8_t* block_scales;   // [T, Hkv, D/16]
  uint8_t* mantissa_bits;  // [T, Hkv, D/8]
};

// N consecutive blocks' outputs in one store each (N = 1, 2 or 4; dst aligned to the whole store).
template <int N>
__device__ __forceinline__ void store_blocks(uint8_t* dst, const uint2 (&q)[N]) {  // 8 code bytes per block
  if constexpr (N == 1) {
    *reinterpret_cast<uint2*>(dst) = q[0];
  } else {
#pragma unroll
    for (int j = 0; j < N; j += 2)
      reinterpret_cast<uint4*>(dst)[j / 2] = make_uint4(q[j].x, q[j].y, q[j + 1].x, q[j + 1].y);
  }
}
template <int N>
__device__ __forceinline__ void store_bytes(uint8_t* dst, const uint8_t (&b)[N]) {  // 1 byte per block
  if constexpr (N == 1) {
    *dst = b[0];
  } else if constexpr (N == 2) {
    *reinterpret_cast<uint16_t*>(dst) = static_cast<uint16_t>(b[0] | (b[1] << 8));
  } else {
    static_assert(N == 4, "1, 2 or 4 blocks per thread");
    *reinterpret_cast<uint32_t*>(dst) = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  }
}
template <int N>
__device__ __forceinline__ void store_halves(uint8_t* dst, const uint16_t (&h)[N]) {  // 2 bytes per block
  if constexpr (N == 1) {
    *reinterpret_cast<uint16_t*>(dst) = h[0];
  } else {
#pragma unroll
    for (int j = 0; j < N; j += 2)
      reinterpret_cast<uint32_t*>(dst)[j / 2] = h[j] | (static_cast<uint32_t>(h[j + 1]) << 16);
  }
}

// One half block (8 elements) on the fast path: its code word in the cache's layout (kv_codes.cuh),
// formed from the binary search's masks without packing nibbles first, and its 8 mantissa bits.
__device__ __forceinline__ uint32_t kv_half_block_fast(const uint4& raw, const PackedThresholds<__nv_bfloat16>& p,
                                                       uint32_t& mantissa) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t k2[4], k1[4], k0[4], sign[4];
  uint32_t bits = 0;  // element 2i at bit 2i, element 2i + 1 at bit 17 + 2i
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const PairClasses c = classify_pair_masks<__nv_bfloat16>(w[i], p.b);
    k2[i] = c.k2;
    k1[i] = c.k1;
    k0[i] = c.k0;
    sign[i] = c.sign;
    bits |= c.k0 & ((1u << (2 * i)) | (1u << (17 + 2 * i)));
  }
  mantissa = (bits | (bits >> 16)) & 0xFFu;
  return kv_codes::encode_classes(k2, k1, k0, sign);
}

// One row group per thread; grid = the row tiles. (A persistent grid that loaded the next tile while
// quantizing the current one, variant "p" of 426f3ba, was slower on the H200: 74 registers left 24
// warps per SM for an ALU-bound loop; docs/kv_cache.md.)
template <class Cfg>
__device__ __forceinline__ void kv_append_nvfp4(const __nv_bfloat16* __restrict__ x,  // [T, Hkv, D]
                                                const int64_t* __restrict__ slot_mapping,  // [T]
                                                Nvfp4PagePtrs pages, GuidancePtrs guidance, int tokens,
                                                int64_t num_slots, int which, uint32_t* __restrict__ status) {
  constexpr int D = Cfg::D;
  constexpr int TPR = Cfg::kThreadsPerRow;
  constexpr int BPT = Cfg::kBlocksPerThread;
  const int rows = tokens * Cfg::HKV;
  const int lane = threadIdx.x % TPR;  // the thread's blocks: lane * BPT .. lane * BPT + BPT - 1
  const int row = blockIdx.x * Cfg::kRowsPerCta + threadIdx.x / TPR;  // token * Hkv + head
  const bool row_ok = row < rows;
  const int token = row / Cfg::HKV;
  const int head = row - token * Cfg::HKV;
  // Read the slot with the row's loads, not after the row amax: its latency then hides behind theirs.
  const int64_t slot = row_ok ? __ldg(slot_mapping + token) : -1;

  Vec8<__nv_bfloat16> v[BPT][2];  // [block][half block], raw
  float block_amax[BPT];
#pragma unroll
  for (int j = 0; j < BPT; ++j) {
    const int64_t offset = static_cast<int64_t>(row) * D + (lane * BPT + j) * 16;
    if (row_ok) {
      v[j][0].load_stream(x + offset);
      v[j][1].load_stream(x + offset + 8);
    } else {
      v[j][0].zero();
      v[j][1].zero();
    }
  }
  float amax = 0.f;
#pragma unroll
  for (int j = 0; j < BPT; ++j) {
    block_amax[j] = block16_abs_max<__nv_bfloat16>(v[j][0], v[j][1]);
    amax = j == 0 ? block_amax[0] : nvfp4::fmax_nan(amax, block_amax[j]);
  }
#pragma unroll
  for (int offset = TPR / 2; offset >= 1; offset /= 2)
    amax = nvfp4::fmax_nan(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  if (!row_ok) return;

  if (!nvfp4::is_finite(amax)) {  // nothing of this row is written; the host raises on the flag
    const uint64_t flat_row = static_cast<uint64_t>(which) * rows + row;  // rows of [2 (K, V), T, Hkv]
#pragma unroll
    for (int j = 0; j < BPT; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float f[8];
        v[j][h].to_float(f);
        if (!nvfp4::is_finite(half_block_amax(f)))
          report_nonfinite(status, kStatusKvAppend, flat_row, (lane * BPT + j) * 16 + 8 * h, f);
      }
    return;
  }
  if (slot < 0 || slot >= num_slots) return;  // rejected on the host; never write out of bounds
  const int64_t dest = slot * Cfg::HKV + head;

  const float s = __fdiv_rn(amax, nvfp4::kGlobalDivisor);
  const bool fast = row_scale_fast(s);  // branch-free blocks (quantize_epilogue.cuh)
  const nvfp4::Divisor six_s_div = nvfp4::make_divisor(nvfp4::kFp4Max * s);
  // The thread's BPT consecutive blocks, gathered so that each output takes one store of BPT x its
  // per-block bytes (codes 8, block scale 1, mantissa bits 2) instead of BPT stores.
  uint2 q[BPT];
  uint8_t scale_bits[BPT];
  uint16_t mantissa[BPT];
#pragma unroll
  for (int j = 0; j < BPT; ++j) {
    uint4 unused_lo, unused_hi;
    const nvfp4::BlockStep step =
        fast ? block_step_fast(block_amax[j], s, six_s_div) : nvfp4::block_step(block_amax[j], s, nvfp4::kFp4Max * s);
    scale_bits[j] = step.scale_bits;
    if (fast) {  // the binary search's masks straight into the cache's code words
      const PackedThresholds<__nv_bfloat16> p = fast_thresholds<__nv_bfloat16>(step);
      uint32_t bits_lo, bits_hi;
      q[j] = make_uint2(kv_half_block_fast(v[j][0].raw, p, bits_lo), kv_half_block_fast(v[j][1].raw, p, bits_hi));
      mantissa[j] = static_cast<uint16_t>(bits_lo | (bits_hi << 8));
    } else {
      const uint2 codes = quantize_block16<__nv_bfloat16>(v[j][0], v[j][1], step, false, unused_lo, unused_hi);
      q[j] = make_uint2(kv_codes::encode(codes.x), kv_codes::encode(codes.y));
      mantissa[j] = static_cast<uint16_t>(mantissa_bits_of(codes.x) | (mantissa_bits_of(codes.y) << 8));
    }
  }
  const int block0 = lane * BPT;
  store_blocks<BPT>(pages.codes + dest * (D / 2) + block0 * 8, q);
  store_bytes<BPT>(pages.block_scales + dest * (D / 16) + block0, scale_bits);
  if (guidance.mantissa_bits != nullptr) {
    store_halves<BPT>(guidance.mantissa_bits + static_cast<int64_t>(row) * (D / 8) + block0 * 2, mantissa);
    store_bytes<BPT>(guidance.block_scales + static_cast<int64_t>(row) * (D / 16) + block0, scale_bits);
  }
  if (lane == 0) {
    pages.scale[dest] = s;
    if (guidance.mantissa_bits != nullptr) guidance.scale[row] = s;
  }
}

template <int D_, int HKV_, int CTA_>
struct KvAppendBf16Config {
  static constexpr int D = D_;
  static constexpr int HKV = HKV_;
  static constexpr int CTA = CTA_;
  static constexpr int kThreadsPerRow = D / 8;  // 16 bytes per thread
  static constexpr int kRowsPerCta = CTA / kThreadsPerRow;
  static_assert(D % 8 == 0 && CTA % kThreadsPerRow == 0, "D must be a multiple of 8 and rows fit the CTA");
};

// Scatter copy into BF16 pages: data [slots, Hkv, D].
template <class Cfg>
__device__ __forceinline__ void kv_append_bf16(const __nv_bfloat16* __restrict__ x,  // [T, Hkv, D]
                                               const int64_t* __restrict__ slot_mapping,  // [T]
                                               __nv_bfloat16* __restrict__ pages, int tokens, int64_t num_slots) {
  constexpr int D = Cfg::D;
  const int rows = tokens * Cfg::HKV;
  const int lane = threadIdx.x % Cfg::kThreadsPerRow;
  const int row = blockIdx.x * Cfg::kRowsPerCta + threadIdx.x / Cfg::kThreadsPerRow;
  if (row >= rows) return;
  const int token = row / Cfg::HKV;
  const int64_t slot = slot_mapping[token];
  if (slot < 0 || slot >= num_slots) return;
  const uint4 v = __ldcs(reinterpret_cast<const uint4*>(x + static_cast<int64_t>(row) * D) + lane);
  reinterpret_cast<uint4*>(pages + (slot * Cfg::HKV + (row - token * Cfg::HKV)) * D)[lane] = v;
}

}  // namespace trace_kernels
