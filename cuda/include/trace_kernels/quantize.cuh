// Row quantization to NVFP4 (scale="row"): x [rows, D] -> codes [rows, D/2], E4M3 block scales
// [rows, D/16], FP32 row scales [rows]; optionally the compact guidance bits [rows, D/8] and the
// BF16 "code x block scale" operand [rows, D] in the same pass.
//
// Work split: a row group of TPR threads owns one row; thread t holds half blocks (8 elements,
// one 16-byte load for 16-bit inputs) t, t+TPR, ... in registers. The two halves of a block sit
// in neighbouring lanes (TPR is even), so the block amax is one shuffle; the row amax is a
// shuffle tree (plus shared memory when TPR > 32). One read of x, one write of each output.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include "trace_kernels/nvfp4.cuh"
#include "trace_kernels/quantize_epilogue.cuh"
#include "trace_kernels/status.cuh"
#include "trace_kernels/vec.cuh"

namespace trace_kernels {

template <typename T_, int D_, int TPR_, int CTA_>
struct QuantizeRowsConfig {
  using T = T_;
  static constexpr int D = D_;
  static constexpr int TPR = TPR_;  // threads per row (power of two, >= 2)
  static constexpr int CTA = CTA_;  // threads per block (multiple of TPR)
  static constexpr int kHalfBlocks = D / 8;
  static constexpr int kSlots = (kHalfBlocks + TPR - 1) / TPR;  // half blocks per thread
  static constexpr int kRowsPerCta = CTA / TPR;
  static constexpr int kWarpsPerRow = TPR > 32 ? TPR / 32 : 1;
  static_assert(D % nvfp4::kBlock == 0, "D must be a multiple of 16");
  static_assert(TPR >= 2 && (TPR & (TPR - 1)) == 0, "TPR must be a power of two >= 2");
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

}  // namespace trace_kernels
