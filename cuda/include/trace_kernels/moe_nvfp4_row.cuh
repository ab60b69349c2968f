// NVFP4 row quantization of one BF16 row by one warp, bit-exact with trace_kernels.nvfp4.quantize
// (scale="row"), plus the MoE GEMM's extra outputs: the BF16 "value(code) * block scale" operand
// and the compact TRACE guidance bits. Used by the fused SwiGLU epilogue of moe_gemm.cuh.
//
// The arithmetic is nvfp4.cuh's (s = amax / 2688, nvfp4::e4m3_round, nvfp4::e2m1_code), in the
// reference's order with IEEE divisions.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "trace_kernels/nvfp4.cuh"
#include "trace_kernels/status.cuh"

namespace trace_kernels::moe {

// Status-word op bit of the fused gate_up epilogue (status.cuh's StatusOp uses 1, 2, 4).
constexpr uint32_t kStatusMoeGateUp = 8u;

__device__ __forceinline__ float bf16_lo(uint32_t pair) { return __uint_as_float(pair << 16); }  // exact
__device__ __forceinline__ float bf16_hi(uint32_t pair) { return __uint_as_float(pair & 0xFFFF0000u); }

// Quantize h[0..D) (one row, read through L2: other CTAs wrote it) with the 32 lanes of a warp.
template <int D>
__device__ __forceinline__ void quantize_row_nvfp4(const __nv_bfloat16* h, int64_t row, int lane,
                                                   uint8_t* codes, uint8_t* block_scales, float* row_scale,
                                                   __nv_bfloat16* dequant, uint8_t* mantissa_bits,
                                                   uint32_t* status) {
  static_assert(D % 16 == 0, "D must be a multiple of 16");
  constexpr int kBlocks = D / 16;
  constexpr int kPerLane = (kBlocks + 31) / 32;
  uint32_t raw[kPerLane][8];  // bf16 pairs: half the registers of keeping FP32 copies
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int blk = lane + 32 * i;
    if (blk < kBlocks) {
      const uint4* src = reinterpret_cast<const uint4*>(h + blk * 16);
      const uint4 lo = __ldcg(src), hi = __ldcg(src + 1);
      raw[i][0] = lo.x; raw[i][1] = lo.y; raw[i][2] = lo.z; raw[i][3] = lo.w;
      raw[i][4] = hi.x; raw[i][5] = hi.y; raw[i][6] = hi.z; raw[i][7] = hi.w;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        amax = nvfp4::fmax_nan(amax, nvfp4::fmax_nan(fabsf(bf16_lo(raw[i][j])), fabsf(bf16_hi(raw[i][j]))));
    }
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) amax = nvfp4::fmax_nan(amax, __shfl_xor_sync(0xffffffffu, amax, d));
  if (!nvfp4::is_finite(amax)) {  // SwiGLU overflowed: report, leave this row's outputs unwritten
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int blk = lane + 32 * i;
      if (blk >= kBlocks) continue;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float v[8];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          v[2 * j] = bf16_lo(raw[i][4 * half + j]);
          v[2 * j + 1] = bf16_hi(raw[i][4 * half + j]);
        }
        report_nonfinite(status, kStatusMoeGateUp, static_cast<uint64_t>(row), blk * 16 + half * 8, v);
      }
    }
    return;
  }
  const float s = __fdiv_rn(amax, nvfp4::kGlobalDivisor);
  if (lane == 0) row_scale[row] = s;
  const float six_s = 6.0f * s;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int blk = lane + 32 * i;
    if (blk >= kBlocks) continue;
    float bamax = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) bamax = fmaxf(bamax, fmaxf(fabsf(bf16_lo(raw[i][j])), fabsf(bf16_hi(raw[i][j]))));
    // b = e4m3(bamax / (6 s)) (0 when s == 0), d = float(b) * s
    float b = 0.0f;
    const uint8_t b_bits = (s == 0.0f) ? uint8_t(0) : nvfp4::e4m3_round(__fdiv_rn(bamax, six_s), &b);
    const float d = b * s;
    uint32_t packed[2] = {0u, 0u};
    uint32_t bits = 0u;
    uint32_t deq[8];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const uint32_t c = (d == 0.0f) ? 0u : nvfp4::e2m1_code(__fdiv_rn(j % 2 ? bf16_hi(raw[i][j / 2]) : bf16_lo(raw[i][j / 2]), d));
      packed[j / 8] |= c << (4 * (j % 8));
      bits |= (c & 1u) << j;
      const float v = nvfp4::code_value(c) * b;  // exact in BF16
      const __nv_bfloat16 vb = __float2bfloat16_rn(v);
      const uint32_t vbits = *reinterpret_cast<const uint16_t*>(&vb);
      if (j % 2 == 0) deq[j / 2] = vbits; else deq[j / 2] |= vbits << 16;
    }
    const int64_t d_half = D / 2, d_16 = D / 16, d_8 = D / 8;
    *reinterpret_cast<uint2*>(codes + row * d_half + blk * 8) = make_uint2(packed[0], packed[1]);
    block_scales[row * d_16 + blk] = b_bits;
    uint4* dq = reinterpret_cast<uint4*>(dequant + row * D + blk * 16);
    dq[0] = make_uint4(deq[0], deq[1], deq[2], deq[3]);
    dq[1] = make_uint4(deq[4], deq[5], deq[6], deq[7]);
    *reinterpret_cast<uint16_t*>(mantissa_bits + row * d_8 + blk * 2) = static_cast<uint16_t>(bits);
  }
}

}  // namespace trace_kernels::moe
