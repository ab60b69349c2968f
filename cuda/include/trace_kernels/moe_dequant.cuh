// In-register dequantization of the packed MoE weights (encoding: python/trace_kernels/moe_encoding.py).
//
// One k16 step of one thread: a 32-bit encoded code word q and two encoded scale bytes (rows r and
// r+8) -> the four BF16x2 wgmma A registers a0..a3 = value(code) * block scale * 2^-7, exactly.
//   codes:  a0 = q & kFieldMask, a1 = rotl(q, 12) & kFieldMask, a2 = (rotl(q, 8) ^ (q << 2)) & kFieldMask,
//           a3 = (rotl(q, 8) ^ (q << 6)) & kFieldMask (moe_encoding.REGISTER_TERMS) is the BF16 pair of
//           value * 2^-126 (sign, exponent bits 8..7 and mantissa bit 6 of each half; the code 0.5
//           is a BF16 subnormal, which bf16 multiplication keeps): one LOP3 per register and four
//           shifts per word, two of them plain left shifts that ptxas can issue as IMAD.SHL on the
//           FMA pipe, instead of a shared-memory table lookup.
//   scales: byte c -> BF16 (c << 4) + 0x7000 = block scale * 2^119, both rows of a step in one
//           PRMT + one multiply-add (a LEA in SASS); the HMUL2 takes the row's half by operand selection.
// The product is value * b * 2^-7 (at most 6 significant bits, exponent well inside BF16's normal
// range): exact. The epilogue's row scale multiplies by kWeightScaleFold to undo the 2^-7.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

namespace trace_kernels::moe::dequant {

constexpr int kRotA1 = 12, kRotA23 = 8, kShlA2 = 2, kShlA3 = 6;  // moe_encoding.REGISTER_TERMS
constexpr uint32_t kFieldMask = 0x81C081C0u;                 // moe_encoding.FIELD_MASK
constexpr uint32_t kScaleBias = 0x70007000u;                 // moe_encoding.SCALE_BIAS, both halves
constexpr float kWeightScaleFold = 128.0f;                   // moe_encoding.WEIGHT_SCALE_FOLD

__device__ __forceinline__ uint32_t rotl(uint32_t x, int s) { return __funnelshift_l(x, x, s); }

__device__ __forceinline__ __nv_bfloat162 as_bf162(uint32_t x) { return *reinterpret_cast<__nv_bfloat162*>(&x); }
__device__ __forceinline__ uint32_t as_u32(__nv_bfloat162 x) { return *reinterpret_cast<uint32_t*>(&x); }

// BF16 pair (S_r, S_r8) of k16 step j from the thread's scale word (bytes 2(j&1), 2(j&1)+1).
__device__ __forceinline__ uint32_t scale_pair(uint32_t scale_word, int j) {
  const uint32_t bytes = __byte_perm(scale_word, 0u, (j & 1) ? 0x4342u : 0x4140u);  // [c_r, 0, c_r8, 0]
  return bytes * 16u + kScaleBias;
}

// a0..a3 of one k16 step: a0, a2 rows r (scale low half), a1, a3 rows r+8 (high half).
__device__ __forceinline__ void dequant_step(uint32_t q, uint32_t scales, uint32_t (&a)[4]) {
  const __nv_bfloat162 s = as_bf162(scales);
  const __nv_bfloat162 s_r = __low2bfloat162(s), s_r8 = __high2bfloat162(s);
  const uint32_t r8 = rotl(q, kRotA23);  // shared by a2 and a3
  a[0] = as_u32(__hmul2(as_bf162(q & kFieldMask), s_r));
  a[1] = as_u32(__hmul2(as_bf162(rotl(q, kRotA1) & kFieldMask), s_r8));
  a[2] = as_u32(__hmul2(as_bf162((r8 ^ (q << kShlA2)) & kFieldMask), s_r));
  a[3] = as_u32(__hmul2(as_bf162((r8 ^ (q << kShlA3)) & kFieldMask), s_r8));
}

}  // namespace trace_kernels::moe::dequant
