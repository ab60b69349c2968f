// Row quantization to NVFP4 (scale="row"): x [rows, D] -> codes [rows, D/2], E4M3 block scales
// [rows, D/16], FP32 row scales [rows]; optionally the compact guidance bits [rows, D/8] and the
// BF16 "code x block scale" operand [rows, D] in the same pass.
//
// Two variants (QuantizeRowsConfig::kVariant), both one read of x and one write of each output:
// v1: a row group of TPR threads owns one row; thread t holds half blocks (8 elements, one 16-byte
//     load for 16-bit inputs) t, t+TPR, ... in registers. The two halves of a block sit in
//     neighbouring lanes (TPR is even), so the block amax is one shuffle.
// v2: thread t owns whole blocks t, t+TPR, ... (two 16-byte loads each, all issued before the
//     first use): the block step and the 7 thresholds are computed once per block instead of once
//     per half block, and no block-amax shuffle is needed; 2x the bytes in flight per thread.
// The row amax is a shuffle tree (plus shared memory when TPR > 32).
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "trace_kernels/bulk_copy.cuh"
#include "trace_kernels/nvfp4.cuh"
#include "trace_kernels/pdl.cuh"
#include "trace_kernels/quantize_epilogue.cuh"
#include "trace_kernels/status.cuh"
#include "trace_kernels/vec.cuh"

namespace trace_kernels {

template <typename T_, int D_, int TPR_, int CTA_, int VARIANT_ = 1, int ROWS_PER_ITEM_ = 1, int STAGES_ = 1>
struct QuantizeRowsConfig {
  using T = T_;
  static constexpr int D = D_;
  static constexpr int TPR = TPR_;  // threads per row (power of two; v1: >= 2)
  static constexpr int CTA = CTA_;  // threads per block (multiple of TPR)
  static constexpr int kVariant = VARIANT_;
  static constexpr int kHalfBlocks = D / 8;
  static constexpr int kBlocks = D / 16;
  static constexpr int kSlots = (kHalfBlocks + TPR - 1) / TPR;  // v1: half blocks per thread
  static constexpr int kBlockSlots = (kBlocks + TPR - 1) / TPR;  // v2: blocks per thread
  static constexpr int kRowsPerCta = CTA / TPR;
  static constexpr int kWarpsPerRow = TPR > 32 ? TPR / 32 : 1;
  static constexpr int kRowsPerWarpPass = TPR <= 32 ? 32 / TPR : 1;  // v4: rows a warp quantizes at once
  static constexpr int kRowsPerItem = ROWS_PER_ITEM_;                  // v4: rows per bulk copy
  static constexpr int kStages = STAGES_;                              // v4: bulk copies in flight per warp
  static_assert(D % nvfp4::kBlock == 0, "D must be a multiple of 16");
  static_assert(VARIANT_ == 1 || VARIANT_ == 2 || VARIANT_ == 4, "variants: 1, 2, 4");
  static_assert((TPR >= 2 || VARIANT_ != 1) && TPR >= 1 && (TPR & (TPR - 1)) == 0,
                "TPR must be a power of two (>= 2 for v1: a block's halves sit in two lanes)");
  static_assert(CTA % TPR == 0 && CTA % 32 == 0 && CTA <= 1024, "CTA must hold whole rows and warps");
};

// amax over the TPR threads of a row group (all threads of the block must call it).
template <class Cfg>
__device__ __forceinline__ float row_group_amax(float v) {
  constexpr int kShuffleWidth = Cfg::TPR < 32 ? Cfg::TPR : 32;
#pragma unroll
  for (int offset = kShuffleWidth / 2; offset >= 1; offset /= 2)
    v = nvfp4::fmax_nan(v, __shfl_xor_sync(0xffffffffu, v, offset));
  if constexpr (Cfg::TPR > 32) {
    __shared__ float warp_amax[Cfg::CTA / 32];  // [warps]
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) warp_amax[warp] = v;
    __syncthreads();
    const int first = (warp / Cfg::kWarpsPerRow) * Cfg::kWarpsPerRow;
    v = warp_amax[first];
#pragma unroll
    for (int w = 1; w < Cfg::kWarpsPerRow; ++w) v = nvfp4::fmax_nan(v, warp_amax[first + w]);
  }
  return v;
}

template <class Cfg>
__device__ __forceinline__ void quantize_rows(const typename Cfg::T* __restrict__ x,  // [rows, D]
                                              uint8_t* __restrict__ codes,            // [rows, D/2]
                                              uint8_t* __restrict__ block_scales,     // [rows, D/16] e4m3
                                              float* __restrict__ row_scales,         // [rows]
                                              uint8_t* __restrict__ mantissa_bits,    // [rows, D/8] or null
                                              __nv_bfloat16* __restrict__ dequant,    // [rows, D] or null
                                              int rows, uint32_t* __restrict__ status) {
  using T = typename Cfg::T;
  constexpr int D = Cfg::D;
  const int lane = threadIdx.x % Cfg::TPR;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * Cfg::kRowsPerCta + threadIdx.x / Cfg::TPR;
  const bool row_ok = row < rows;

  Vec8<T> v[Cfg::kSlots];  // the thread's half blocks, raw
#pragma unroll
  for (int k = 0; k < Cfg::kSlots; ++k) {
    const int h = lane + k * Cfg::TPR;
    if (row_ok && h < Cfg::kHalfBlocks) v[k].load_stream(x + row * D + h * 8);
    else v[k].zero();
  }

  float block_amax[Cfg::kSlots];
  float amax = 0.f;
#pragma unroll
  for (int k = 0; k < Cfg::kSlots; ++k) {
    const float half = v[k].abs_max();
    block_amax[k] = nvfp4::fmax_nan(half, __shfl_xor_sync(0xffffffffu, half, 1));
    amax = nvfp4::fmax_nan(amax, block_amax[k]);
  }
  amax = row_group_amax<Cfg>(amax);
  if (!row_ok) return;

  if (!nvfp4::is_finite(amax)) {  // leave this row's outputs alone and raise the flag
#pragma unroll
    for (int k = 0; k < Cfg::kSlots; ++k) {
      const int h = lane + k * Cfg::TPR;
      if (h >= Cfg::kHalfBlocks) continue;
      float f[8];
      v[k].to_float(f);
      if (!nvfp4::is_finite(half_block_amax(f)))
        report_nonfinite(status, kStatusQuantize, static_cast<uint64_t>(row), h * 8, f);
    }
    return;
  }

  const float s = __fdiv_rn(amax, nvfp4::kGlobalDivisor);
  const float six_s = nvfp4::kFp4Max * s;
  if (lane == 0) row_scales[row] = s;

#pragma unroll
  for (int k = 0; k < Cfg::kSlots; ++k) {
    const int h = lane + k * Cfg::TPR;
    if (h >= Cfg::kHalfBlocks) continue;
    const nvfp4::BlockStep step = nvfp4::block_step(block_amax[k], s, six_s);
    uint4 dq;
    const uint32_t q = quantize_vec8<T>(v[k], step, dequant != nullptr, dq);
    reinterpret_cast<uint32_t*>(codes + row * (D / 2))[h] = q;
    if ((h & 1) == 0) block_scales[row * (D / 16) + h / 2] = step.scale_bits;
    if (mantissa_bits != nullptr) mantissa_bits[row * (D / 8) + h] = static_cast<uint8_t>(mantissa_bits_of(q));
    if (dequant != nullptr) *reinterpret_cast<uint4*>(dequant + row * D + h * 8) = dq;
  }
}

// v2 / v4 row body: the thread's whole blocks (b = lane + k TPR) of one row already in registers
// -> amax over the row group, scales, codes and the optional outputs (kDq: the BF16 operand, kBits:
// the guidance bits; compile-time, see quantize_row_blocks). Every lane of the row group calls it
// (row_ok false: the lane only joins the row-amax shuffles). Rows with row_scale_fast(s) (all but
// zero rows and extreme magnitudes) take the branch-free block path.
template <class Cfg, bool kDq, bool kBits>
__device__ __forceinline__ void quantize_row_blocks_impl(const Vec8<typename Cfg::T> (&v)[Cfg::kBlockSlots][2],
                                                         int64_t row, int lane, bool row_ok,
                                                         uint8_t* __restrict__ codes,
                                                         uint8_t* __restrict__ block_scales,
                                                         float* __restrict__ row_scales,
                                                         uint8_t* __restrict__ mantissa_bits,
                                                         __nv_bfloat16* __restrict__ dequant,
                                                         uint32_t* __restrict__ status) {
  using T = typename Cfg::T;
  constexpr int D = Cfg::D;
  constexpr int kSlots = Cfg::kBlockSlots;
  float block_amax[kSlots];
  float amax = 0.f;
#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    block_amax[k] = block16_abs_max<T>(v[k][0], v[k][1]);
    amax = nvfp4::fmax_nan(amax, block_amax[k]);
  }
  amax = row_group_amax<Cfg>(amax);
  if (!row_ok) return;

  if (!nvfp4::is_finite(amax)) {  // leave this row's outputs alone and raise the flag
#pragma unroll
    for (int k = 0; k < kSlots; ++k) {
      const int b = lane + k * Cfg::TPR;
      if (b >= Cfg::kBlocks || nvfp4::is_finite(block_amax[k])) continue;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float f[8];
        v[k][half].to_float(f);
        if (!nvfp4::is_finite(half_block_amax(f)))
          report_nonfinite(status, kStatusQuantize, static_cast<uint64_t>(row), b * 16 + half * 8, f);
      }
    }
    return;
  }

  const float s = __fdiv_rn(amax, nvfp4::kGlobalDivisor);
  const float six_s = nvfp4::kFp4Max * s;
  if (lane == 0) row_scales[row] = s;
  const bool fast = row_scale_fast(s);
  const nvfp4::Divisor six_s_div = nvfp4::make_divisor(six_s);

#pragma unroll
  for (int k = 0; k < kSlots; ++k) {
    const int b = lane + k * Cfg::TPR;
    if (b >= Cfg::kBlocks) continue;
    uint4 dq_lo, dq_hi;
    nvfp4::BlockStep step;
    uint2 q;
    if (fast) {
      step = block_step_fast(block_amax[k], s, six_s_div);
      q = quantize_block16_fast<T, kDq>(v[k][0], v[k][1], step, dq_lo, dq_hi);
    } else {
      step = nvfp4::block_step(block_amax[k], s, six_s);
      q = quantize_block16<T>(v[k][0], v[k][1], step, kDq, dq_lo, dq_hi);
    }
    reinterpret_cast<uint2*>(codes + row * (D / 2))[b] = q;  // 8 bytes per block
    block_scales[row * (D / 16) + b] = step.scale_bits;
    if constexpr (kBits)
      reinterpret_cast<uint16_t*>(mantissa_bits + row * (D / 8))[b] =
          static_cast<uint16_t>(mantissa_bits_of(q.x) | (mantissa_bits_of(q.y) << 8));
    if constexpr (kDq) {
      *reinterpret_cast<uint4*>(dequant + row * D + b * 16) = dq_lo;
      *reinterpret_cast<uint4*>(dequant + row * D + b * 16 + 8) = dq_hi;
    }
  }
}

// The optional outputs picked once per call (uniform), so the block loop has no per-block checks.
template <class Cfg>
__device__ __forceinline__ void quantize_row_blocks(const Vec8<typename Cfg::T> (&v)[Cfg::kBlockSlots][2],
                                                    int64_t row, int lane, bool row_ok,
                                                    uint8_t* __restrict__ codes, uint8_t* __restrict__ block_scales,
                                                    float* __restrict__ row_scales,
                                                    uint8_t* __restrict__ mantissa_bits,
                                                    __nv_bfloat16* __restrict__ dequant,
                                                    uint32_t* __restrict__ status) {
  if (dequant != nullptr) {
    if (mantissa_bits != nullptr)
      quantize_row_blocks_impl<Cfg, true, true>(v, row, lane, row_ok, codes, block_scales, row_scales, mantissa_bits,
                                                dequant, status);
    else
      quantize_row_blocks_impl<Cfg, true, false>(v, row, lane, row_ok, codes, block_scales, row_scales, mantissa_bits,
                                                 dequant, status);
  } else if (mantissa_bits != nullptr) {
    quantize_row_blocks_impl<Cfg, false, true>(v, row, lane, row_ok, codes, block_scales, row_scales, mantissa_bits,
                                               dequant, status);
  } else {
    quantize_row_blocks_impl<Cfg, false, false>(v, row, lane, row_ok, codes, block_scales, row_scales, mantissa_bits,
                                                dequant, status);
  }
}

// The thread's whole blocks b = lane + k TPR of one row ([kBlockSlots][2] half blocks, raw; zeros
// past the row's blocks or when !row_ok). kShared: the row is in shared memory (v4), else global.
template <class Cfg, bool kShared>
__device__ __forceinline__ void load_row_blocks(Vec8<typename Cfg::T> (&v)[Cfg::kBlockSlots][2],
                                                const typename Cfg::T* row_x, int lane, bool row_ok) {
#pragma unroll
  for (int k = 0; k < Cfg::kBlockSlots; ++k) {
    const int b = lane + k * Cfg::TPR;
    if (row_ok && b < Cfg::kBlocks) {
      if constexpr (kShared) {
        v[k][0].load_shared(row_x + b * 16);
        v[k][1].load_shared(row_x + b * 16 + 8);
      } else {
        v[k][0].load(row_x + b * 16);
        v[k][1].load(row_x + b * 16 + 8);
      }
    } else {
      v[k][0].zero();
      v[k][1].zero();
    }
  }
}

// v2: whole blocks per thread (see the file comment). Same outputs, bit for bit, as v1.
template <class Cfg>
__device__ __forceinline__ void quantize_rows_v2(const typename Cfg::T* __restrict__ x,  // [rows, D]
                                                 uint8_t* __restrict__ codes,            // [rows, D/2]
                                                 uint8_t* __restrict__ block_scales,     // [rows, D/16] e4m3
                                                 float* __restrict__ row_scales,         // [rows]
                                                 uint8_t* __restrict__ mantissa_bits,    // [rows, D/8] or null
                                                 __nv_bfloat16* __restrict__ dequant,    // [rows, D] or null
                                                 int rows, uint32_t* __restrict__ status) {
  using T = typename Cfg::T;
  constexpr int D = Cfg::D;
  const int lane = threadIdx.x % Cfg::TPR;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * Cfg::kRowsPerCta + threadIdx.x / Cfg::TPR;
  const bool row_ok = row < rows;

  // __ldg (L1-allocating): the second 16 bytes of each 32-byte sector come from L1, so each sector
  // is fetched from L2 once.
  Vec8<T> v[Cfg::kBlockSlots][2];
  load_row_blocks<Cfg, false>(v, x + row * D, lane, row_ok);
  quantize_row_blocks<Cfg>(v, row, lane, row_ok, codes, block_scales, row_scales, mantissa_bits, dequant, status);
}

// v4: v2's row body fed through shared memory by bulk copies (TMA) instead of per-thread loads, so
// a warp's loads are always kStages items ahead of its arithmetic whatever its register count.
// Persistent: warp w of the grid takes items w, w + warps, ... of kRowsPerItem consecutive rows
// (one contiguous bulk copy each) through a ring of kStages buffers of its own (no CTA barrier);
// lane 0 refills a buffer with the item kStages ahead once the warp has read it into registers.
// Shared memory: kWarps * kStages * item bytes, then the kWarps * kStages mbarriers.
template <class Cfg>
__device__ __forceinline__ void quantize_rows_v4(const typename Cfg::T* __restrict__ x,  // [rows, D]
                                                 uint8_t* __restrict__ codes,            // [rows, D/2]
                                                 uint8_t* __restrict__ block_scales,     // [rows, D/16] e4m3
                                                 float* __restrict__ row_scales,         // [rows]
                                                 uint8_t* __restrict__ mantissa_bits,    // [rows, D/8] or null
                                                 __nv_bfloat16* __restrict__ dequant,    // [rows, D] or null
                                                 int rows, uint32_t* __restrict__ status) {
  using T = typename Cfg::T;
  constexpr int D = Cfg::D;
  constexpr int kItemElems = Cfg::kRowsPerItem * D;
  constexpr int kWarps = Cfg::CTA / 32;
  static_assert(Cfg::TPR <= 32 && Cfg::kRowsPerItem % Cfg::kRowsPerWarpPass == 0, "v4: whole rows per warp");
  static_assert(kItemElems * sizeof(T) % 16 == 0, "bulk copies move multiples of 16 bytes");
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x / 32, lane32 = threadIdx.x % 32;
  T* ring = reinterpret_cast<T*>(smem) + static_cast<int64_t>(warp) * Cfg::kStages * kItemElems;  // [kStages][item]
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kWarps * Cfg::kStages * kItemElems * sizeof(T)) +
                   warp * Cfg::kStages;  // [kStages]

  const int64_t items = (static_cast<int64_t>(rows) + Cfg::kRowsPerItem - 1) / Cfg::kRowsPerItem;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  auto fetch = [&](int64_t item, int stage) {  // lane 0 only
    if (item >= items) return;
    const int64_t row0 = item * Cfg::kRowsPerItem;
    const int64_t item_rows = rows - row0 < Cfg::kRowsPerItem ? rows - row0 : Cfg::kRowsPerItem;
    const uint32_t bytes = static_cast<uint32_t>(item_rows * D * sizeof(T));
    bulk::mbar_arrive_expect_tx(&full[stage], bytes);
    bulk::bulk_copy(ring + stage * kItemElems, x + row0 * D, bytes, &full[stage]);
  };
  if (lane32 == 0) {
    for (int s = 0; s < Cfg::kStages; ++s) bulk::mbar_init(&full[s], 1);
    bulk::fence_mbar_init();
    for (int s = 0; s < Cfg::kStages; ++s) fetch(first + s * warps, s);
  }
  __syncwarp();

  const int lane = lane32 % Cfg::TPR;
  int64_t i = 0;
  for (int64_t item = first; item < items; item += warps, ++i) {
    const int stage = static_cast<int>(i % Cfg::kStages);
    bulk::mbar_wait(&full[stage], static_cast<uint32_t>(i / Cfg::kStages) & 1u);
    const T* buf = ring + stage * kItemElems;
#pragma unroll 1
    for (int r = lane32 / Cfg::TPR; r < Cfg::kRowsPerItem; r += Cfg::kRowsPerWarpPass) {
      const int64_t row = item * Cfg::kRowsPerItem + r;
      const bool row_ok = row < rows;
      Vec8<T> v[Cfg::kBlockSlots][2];
      load_row_blocks<Cfg, true>(v, buf + r * D, lane, row_ok);
      if (r + Cfg::kRowsPerWarpPass >= Cfg::kRowsPerItem) {  // the item's last pass: buffer read, refill it
        __syncwarp();
        if (lane32 == 0) fetch(item + Cfg::kStages * warps, stage);
      }
      quantize_row_blocks<Cfg>(v, row, lane, row_ok, codes, block_scales, row_scales, mantissa_bits, dequant, status);
    }
  }
}

// The kernel body the template instantiates: the config's variant picks the implementation.
template <class Cfg>
__device__ __forceinline__ void quantize_rows_kernel(const typename Cfg::T* __restrict__ x, uint8_t* __restrict__ codes,
                                                     uint8_t* __restrict__ block_scales, float* __restrict__ row_scales,
                                                     uint8_t* __restrict__ mantissa_bits,
                                                     __nv_bfloat16* __restrict__ dequant, int rows,
                                                     uint32_t* __restrict__ status) {
  pdl::wait_for_prerequisite_grid();  // x may be the previous kernel's output (launch_into(..., pdl=True))
  pdl::allow_dependent_launch();
  if constexpr (Cfg::kVariant == 4)
    quantize_rows_v4<Cfg>(x, codes, block_scales, row_scales, mantissa_bits, dequant, rows, status);
  else if constexpr (Cfg::kVariant == 2)
    quantize_rows_v2<Cfg>(x, codes, block_scales, row_scales, mantissa_bits, dequant, rows, status);
  else
    quantize_rows<Cfg>(x, codes, block_scales, row_scales, mantissa_bits, dequant, rows, status);
}

}  // namespace trace_kernels
