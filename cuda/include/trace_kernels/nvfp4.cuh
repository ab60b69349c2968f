// NVFP4 numerics on the device: the exact arithmetic of trace_kernels.nvfp4 (docs/numerics.md).
//
// All FP32, IEEE round-to-nearest-even, no reciprocals (division is __fdiv_rn; compile without
// fast-math). Framework-free: raw pointers and CUDA types only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

namespace trace_kernels {
namespace nvfp4 {

constexpr int kBlock = 16;               // elements per E4M3 block scale
constexpr float kGlobalDivisor = 2688.f;  // 6 * 448: s = amax / 2688
constexpr float kFp4Max = 6.f;

// max that propagates NaN (fmaxf drops it), so a block's amax is NaN/Inf iff an element is.
__device__ __forceinline__ float fmax_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

__device__ __forceinline__ bool is_finite(float v) { return fabsf(v) <= 3.402823466e38f; }

// e4m3(v): round to nearest even, saturate to +-448. Returns the byte; *value gets float(b).
__device__ __forceinline__ uint8_t e4m3_round(float v, float* value) {
  const __nv_fp8_storage_t bits = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
  *value = __half2float(__half(__nv_cvt_fp8_to_halfraw(bits, __NV_E4M3)));
  return bits;
}

__device__ __forceinline__ float e4m3_to_float(uint8_t bits) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(bits, __NV_E4M3)));
}

// Magnitude index m (0..7) of |y| rounded to the E2M1 grid [0,.5,1,1.5,2,3,4,6], ties to the even
// index (even m <=> mantissa bit 0), saturating at 6. NaN -> 0 (callers flag NaN separately).
__device__ __forceinline__ uint32_t e2m1_magnitude(float a) {
  return (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.f);
}

// 4-bit code of y: sign bit 3 only when the magnitude is nonzero (a value rounding to 0 is +0).
__device__ __forceinline__ uint32_t e2m1_code(float y) {
  const uint32_t m = e2m1_magnitude(fabsf(y));
  return m | ((y < 0.f && m != 0u) ? 8u : 0u);
}

// Grid value of magnitude index m (0..7) built from its FP32 bits: for m >= 2 the exponent and
// mantissa bit are (m >> 1) + 126 and m & 1, i.e. bits (m + 252) << 22; m = 1 is 0.5, m = 0 is 0.
__device__ __forceinline__ uint32_t e2m1_value_bits(uint32_t m) {
  return m >= 2u ? (m + 252u) << 22 : (m != 0u ? 0x3F000000u : 0u);
}

__device__ __forceinline__ float e2m1_value(uint32_t m) { return __uint_as_float(e2m1_value_bits(m)); }

// Signed value of a 4-bit code (code 8 = -0 never comes out of rounding).
__device__ __forceinline__ float code_value(uint32_t code) {
  return __uint_as_float(e2m1_value_bits(code & 7u) | ((code & 8u) << 28));
}

// Exact x / d (= __fdiv_rn) from r = RN(1/d) by Markstein's correction: q1 is faithful, so the
// residual x - d q1 is exact and RN(q1 + r (x - d q1)) is the correctly rounded quotient. Valid
// while nothing underflows or overflows: d in [2^-40, 2^40] (block_ok) and x == 0 or |x| in
// [2^-80, 2^80]; anything else takes __fdiv_rn.
struct Divisor {
  float d, r;
  bool ok;
};

__device__ __forceinline__ Divisor make_divisor(float d) {
  return Divisor{d, __frcp_rn(d), d >= 0x1p-40f && d <= 0x1p40f};
}

// Markstein quotient; exact when v.ok and x is in range (fast_divisible).
__device__ __forceinline__ float div_rn_fast(float x, const Divisor& v) {
  const float q0 = x * v.r;
  const float q1 = fmaf(fmaf(-v.d, q0, x), v.r, q0);
  return fmaf(fmaf(-v.d, q1, x), v.r, q1);
}

__device__ __forceinline__ bool fast_divisible(float x) {
  const uint32_t ux = __float_as_uint(x) & 0x7fffffffu;
  return ux == 0u || ux - 0x17800000u <= 0x67800000u - 0x17800000u;  // 0 or |x| in [2^-80, 2^80]
}

__device__ __forceinline__ float div_rn(float x, const Divisor& v) {
  return v.ok && fast_divisible(x) ? div_rn_fast(x, v) : __fdiv_rn(x, v.d);
}

// Block quantization step: b = e4m3(bamax / (6 s)) (0 when s == 0), d = float(b) * s.
struct BlockStep {
  uint8_t scale_bits;  // E4M3 byte
  float scale;         // float(b)
  float d;             // float(b) * s; 0 => the block's codes are +0
};

__device__ __forceinline__ BlockStep block_step(float block_amax, float s, float six_s) {
  BlockStep out;
  if (s == 0.f) {
    out.scale_bits = 0;
    out.scale = 0.f;
  } else {
    out.scale_bits = e4m3_round(__fdiv_rn(block_amax, six_s), &out.scale);
  }
  out.d = out.scale * s;
  return out;
}

// Signed grid index -7..7 of a 4-bit code (both zeros -> 0).
__device__ __forceinline__ int signed_index(uint32_t code) {
  const int m = static_cast<int>(code & 7u);
  return (code & 8u) ? -m : m;
}

// Where a = min(|y|, 6) sits on the E2M1 magnitude grid, from its FP32 bits: floor index lo,
// whether a is a grid point, and the round-to-nearest (ties to even) index. For a >= 1 a grid
// point has one mantissa bit, so lo = (bits >> 22) - 252; below 1 the grid is 0, 0.5.
struct GridPos {
  uint32_t lo;
  bool on_grid;
  uint32_t nearest;
};

__device__ __forceinline__ GridPos grid_position(float a) {
  const uint32_t ua = __float_as_uint(a);
  const bool big = a >= 1.f;  // both branches are a few integer ops: select, don't branch
  GridPos p;
  p.lo = big ? (ua >> 22) - 252u : static_cast<uint32_t>(a >= 0.5f);
  p.on_grid = big ? (ua & 0x3FFFFFu) == 0u : (a == 0.f || a == 0.5f);
  p.nearest = big ? ((ua + 0x1FFFFFu + ((ua >> 22) & 1u)) >> 22) - 252u
                  : static_cast<uint32_t>(a > 0.25f) + static_cast<uint32_t>(a >= 0.75f);
  return p;
}

}  // namespace nvfp4
}  // namespace trace_kernels
