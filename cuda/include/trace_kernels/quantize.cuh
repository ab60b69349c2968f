// Row quantization to NVFP4 (scale="row"): x [rows, D] -> codes [rows, D/2], E4M3 block scales
// [rows, D/16], FP32 row scales [rows]; optionally the compact guidance bits [rows, D/8] and the
// BF16 "code x block scale" operand [rows, D] in the same pass.
//
// One read of x and one write of each output (variant v2; v1, half blocks per thread, and v4, fed by bulk copies,
// lost to it on the H200 and were removed): a row group of TPR threads owns one row, thread t its whole blocks
// t, t+TPR, ... (two 16-byte loads each, all issued before the first use), so the block step and the 7 thresholds are
// computed once per block and no block-amax shuffle is needed. The row amax is a shuffle tree (plus shared memory
// when TPR > 32).
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "trace_kernels/nvfp4.cuh"
#include "trace_kernels/pdl.cuh"
#include "trace_kernels/quantize_epilogue.cuh"
#include "trace_kernels/status.cuh"
#include "trace_kernels/vec.cuh"

namespace trace_kernels {

template <typename T_, int D_, int TPR_, int CTA_, int VARIANT_>
struct QuantizeRowsConfig {
  using T = T_;
  static constexpr int D = D_;
  static constexpr int TPR = TPR_;  // threads per row (power of two)
  static constexpr int CTA = CTA_;  // threads per block (multiple of TPR)
  static constexpr int kVariant = VARIANT_;
  static constexpr int kBlocks = D / 16;
  static constexpr int kBlockSlots = (kBlocks + TPR - 1) / TPR;  // whole blocks per thread
  static constexpr int kRowsPerCta = CTA / TPR;
  static constexpr int kWarpsPerRow = TPR > 32 ? TPR / 32 : 1;
  static_assert(D % nvfp4::kBlock == 0, "D must be a multiple of 16");
  static_assert(VARIANT_ == 2, "variants: 2");
  static_assert(TPR >= 1 && (TPR & (TPR - 1)) == 0, "TPR must be a power of two");
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

// The row body: the thread's whole blocks (b = lane + k TPR) of one row already in registers
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
  const float amax = row_group_amax<Cfg>(blocks16_abs_max<T, kSlots>(v, block_amax));
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
// past the row's blocks or when !row_ok).
template <class Cfg>
__device__ __forceinline__ void load_row_blocks(Vec8<typename Cfg::T> (&v)[Cfg::kBlockSlots][2],
                                                const typename Cfg::T* row_x, int lane, bool row_ok) {
#pragma unroll
  for (int k = 0; k < Cfg::kBlockSlots; ++k) {
    const int b = lane + k * Cfg::TPR;
    if (row_ok && b < Cfg::kBlocks) {
      v[k][0].load(row_x + b * 16);
      v[k][1].load(row_x + b * 16 + 8);
    } else {
      v[k][0].zero();
      v[k][1].zero();
    }
  }
}

// Whole blocks per thread (see the file comment).
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
  load_row_blocks<Cfg>(v, x + row * D, lane, row_ok);
  quantize_row_blocks<Cfg>(v, row, lane, row_ok, codes, block_scales, row_scales, mantissa_bits, dequant, status);
}

// The kernel body the template instantiates.
template <class Cfg>
__device__ __forceinline__ void quantize_rows_kernel(const typename Cfg::T* __restrict__ x, uint8_t* __restrict__ codes,
                                                     uint8_t* __restrict__ block_scales, float* __restrict__ row_scales,
                                                     uint8_t* __restrict__ mantissa_bits,
                                                     __nv_bfloat16* __restrict__ dequant, int rows,
                                                     uint32_t* __restrict__ status) {
  pdl::wait_for_prerequisite_grid();  // x may be the previous kernel's output (launch_into(..., pdl=True))
  pdl::allow_dependent_launch();
  quantize_rows_v2<Cfg>(x, codes, block_scales, row_scales, mantissa_bits, dequant, rows, status);
}

}  // namespace trace_kernels
