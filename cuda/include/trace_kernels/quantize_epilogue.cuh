// The guidance-emitting quantize epilogue: one half block (8 elements, FP32 or packed BF16/FP16)
// -> NVFP4 codes, their mantissa bits (compact TRACE guidance) and the BF16 "code x block scale"
// operand, given the block's step (nvfp4::block_step).
//
// quantize and refit_weights call it; any later kernel that writes NVFP4 (an MoE epilogue, KV
// append) can call the same device functions to round exactly like trace_kernels.nvfp4.quantize.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

#include <type_traits>

#include "trace_kernels/nvfp4.cuh"
#include "trace_kernels/vec.cuh"

namespace trace_kernels {

struct HalfBlockOut {
  uint32_t codes;  // 8 nibbles, element j in bits 4j..4j+3 (little endian: 2i low, 2i+1 high)
};

// 0xFFFFFFFF if a >= b else 0 (FSET): sums of these masks count thresholds without branches.
__device__ __forceinline__ uint32_t ge_mask(float a, float b) {
  uint32_t r;
  asm("set.ge.u32.f32 %0, %1, %2;" : "=r"(r) : "f"(a), "f"(b));
  return r;
}

// Rounding x / d to E2M1 without dividing. RN(|x| / d) >= t  <=>  |x| >= X_t for one FP32 X_t per
// threshold, computed exactly once per block with directed-rounding FMAs:
//   ties go up  (t = .75, 1.75, 3.5):  RN(q) >= t <=> q >= t - h  <=> |x| >= RU((t - h) d)
//   ties stay   (t = .25, 1.25, 2.5, 5): RN(q) > t <=> q > t + h  <=> |x| >= succ(RD((t + h) d))
// with h half an ulp of t (t's significand is even, so the tie at t -+ h resolves to t). h*d is a
// power-of-two scaling, exact for d in [2^-100, 2^120]; other d take the division path.
struct E2M1Thresholds {
  float x[7];  // |x| >= x[i]  <=>  magnitude index > i
  bool exact;  // false: d outside the range where the thresholds are exact
};

__device__ __forceinline__ float succ_positive(float v) { return __uint_as_float(__float_as_uint(v) + 1u); }

__device__ __forceinline__ E2M1Thresholds e2m1_thresholds(float d) {
  E2M1Thresholds t;
  t.exact = d >= 0x1p-100f && d <= 0x1p120f;
  t.x[0] = succ_positive(__fmaf_rd(0.25f, d, d * 0x1p-26f));
  t.x[1] = __fmaf_ru(0.75f, d, -(d * 0x1p-25f));
  t.x[2] = succ_positive(__fmaf_rd(1.25f, d, d * 0x1p-24f));
  t.x[3] = __fmaf_ru(1.75f, d, -(d * 0x1p-24f));
  t.x[4] = succ_positive(__fmaf_rd(2.5f, d, d * 0x1p-23f));
  t.x[5] = __fmaf_ru(3.5f, d, -(d * 0x1p-23f));
  t.x[6] = succ_positive(__fmaf_rd(5.f, d, d * 0x1p-22f));
  return t;
}

// x: the half block; step: its block's quantization step (block_step()).
__device__ __forceinline__ HalfBlockOut quantize_half_block(const float (&x)[8], const nvfp4::BlockStep& step) {
  HalfBlockOut out{0u};
  if (step.d == 0.f) return out;  // s == 0 or d == 0: codes +0
  const E2M1Thresholds t = e2m1_thresholds(step.d);
  if (t.exact) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float a = fabsf(x[j]);
      const uint32_t neg_m = ge_mask(a, t.x[0]) + ge_mask(a, t.x[1]) + ge_mask(a, t.x[2]) + ge_mask(a, t.x[3]) +
                             ge_mask(a, t.x[4]) + ge_mask(a, t.x[5]) + ge_mask(a, t.x[6]);
      // sign bit 3 only for a nonzero magnitude (ge_mask(a, t.x[0]) is all ones exactly then)
      const uint32_t sign = (__float_as_uint(x[j]) >> 28) & ge_mask(a, t.x[0]) & 8u;
      out.codes |= ((0u - neg_m) | sign) << (4 * j);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) out.codes |= nvfp4::e2m1_code(__fdiv_rn(x[j], step.d)) << (4 * j);
  }
  return out;
}

// The 8 mantissa bits (bit 0 of each nibble) of packed codes, element j in bit j.
__device__ __forceinline__ uint32_t mantissa_bits_of(uint32_t codes) {
  uint32_t v = codes & 0x11111111u;     // bit 4j
  v = (v | (v >> 3)) & 0x03030303u;     // bits 8i, 8i+1
  v = (v | (v >> 6)) & 0x000F000Fu;     // bits 16i .. 16i+3
  return (v | (v >> 12)) & 0xFFu;
}

// value(code) * float(b) for 8 codes, exact in BF16 (2-bit x 4-bit significands), as one uint4.
__device__ __forceinline__ uint4 dequant_half_block_bf16(uint32_t codes, float block_scale) {
  uint4 out;
  uint32_t* w = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float lo = nvfp4::code_value((codes >> (8 * i)) & 0xFu) * block_scale;
    const float hi = nvfp4::code_value((codes >> (8 * i + 4)) & 0xFu) * block_scale;
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    w[i] = *reinterpret_cast<const uint32_t*>(&h);
  }
  return out;
}

// Half-block amax of |x|, NaN-propagating.
__device__ __forceinline__ float half_block_amax(const float (&x)[8]) {
  float a = fabsf(x[0]);
#pragma unroll
  for (int j = 1; j < 8; ++j) a = nvfp4::fmax_nan(a, fabsf(x[j]));
  return a;
}

// ---------------------------------------------------------------------------------------------
// Packed path for 16-bit inputs: a bf16/fp16 x satisfies x >= X exactly when x >= RU16(X) (the
// smallest 16-bit value >= X), so the thresholds become 16-bit pairs and two elements are
// classified per instruction (HSET2) by a 3-level binary search over the 7 thresholds.
// below_signs(a, -t) is a second, FMA-pipe form of the comparison (HSET2 issues on the ALU pipe): for
// 16-bit a >= 0 and t > 0, RN16(a - t) has the sign of a - t, and is +0 exactly when a == t (a
// nonzero a - t is a multiple of the smallest subnormal, so rounding cannot reach zero, and a flush
// to zero would keep the sign): its sign bit is set exactly when a < t. Finite a only.
// ---------------------------------------------------------------------------------------------
template <typename T>  // __nv_bfloat16 or __half
struct Pair16 {
  using V = Vec8<T>;
  // RU16(x) in both halves
  static __device__ __forceinline__ uint32_t round_up_pair(float x) { return both_halves(round16<true>(x)); }
  static __device__ __forceinline__ uint32_t ge(uint32_t a, uint32_t b) {
    return __hge2_mask(V::as_pair(a), V::as_pair(b));
  }
  // -RU16(x) in both halves (RD16(-x))
  static __device__ __forceinline__ uint32_t negated_round_up_pair(float x) { return both_halves(round16<false>(-x)); }
  // |w| per half as abs.bf16x2 / abs.f16x2 (not a mask): ptxas may fold it into the compares' operands
  static __device__ __forceinline__ uint32_t abs(uint32_t w) { return V::bits(__habs2(V::as_pair(w))); }

 private:
  template <bool kUp>  // x rounded up (RU16) or down (RD16) to T
  static __device__ __forceinline__ T round16(float x) {
    if constexpr (std::is_same<T, __nv_bfloat16>::value) return kUp ? __float2bfloat16_ru(x) : __float2bfloat16_rd(x);
    else return kUp ? __float2half_ru(x) : __float2half_rd(x);
  }
  static __device__ __forceinline__ uint32_t both_halves(T h) {
    return static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(&h)) * 0x00010001u;
  }
};

// a * 1 + neg_t per 16-bit half on the FMA pipe: its sign bits (15, 31) say a < t (see the comment above
// Pair16)
template <typename T>
__device__ __forceinline__ uint32_t below_signs(uint32_t a, uint32_t neg_t) {
  using V = Vec8<T>;
  constexpr uint32_t kOnes = std::is_same<T, __half>::value ? 0x3C003C00u : 0x3F803F80u;
  return V::bits(__hfma2(V::as_pair(a), V::as_pair(kOnes), V::as_pair(neg_t)));
}

__device__ __forceinline__ uint32_t select_bits(uint32_t mask, uint32_t a, uint32_t b) { return (mask & a) | (~mask & b); }

// The binary search of one 32-bit word of two 16-bit elements: per-half masks (0xFFFF or 0) of the
// magnitude index bits (m = 4 k2 + 2 k1 + k0) and of m >= 1, and the signs at bits 15 / 31 (+0 for m = 0).
struct PairClasses {
  uint32_t k2, k1, k0, nonzero, sign;
};

template <typename T>
__device__ __forceinline__ PairClasses classify_pair_masks(uint32_t w, const uint32_t (&b)[7]) {
  PairClasses c;
  const uint32_t a = Pair16<T>::abs(w);
  c.k2 = Pair16<T>::ge(a, b[3]);                                                    // m >= 4
  c.k1 = Pair16<T>::ge(a, select_bits(c.k2, b[5], b[1]));                           // m >= 6 | 2
  c.k0 = Pair16<T>::ge(a, select_bits(c.k2, select_bits(c.k1, b[6], b[4]), select_bits(c.k1, b[2], b[0])));
  c.nonzero = Pair16<T>::ge(a, b[0]);                                               // m >= 1
  c.sign = w & c.nonzero & 0x80008000u;
  return c;
}

// One 32-bit word of two 16-bit elements -> their two code nibbles at bits 0..3 and 16..19 and,
// when dq is wanted, value(code) as a BF16 pair (before the block scale).
template <typename T>
__device__ __forceinline__ uint32_t classify_pair_nibbles(uint32_t w, const uint32_t (&b)[7], bool want_value,
                                                          uint32_t& value_pair) {
  const PairClasses c = classify_pair_masks<T>(w, b);
  const uint32_t m = (c.k2 & 0x00040004u) | (c.k1 & 0x00020002u) | (c.k0 & 0x00010001u);  // per half
  if (want_value) {  // BF16 bits of value(m): (m + 252) << 6 for m >= 2, 0.5 for m = 1
    const uint32_t at_least_two = c.k2 | c.k1;
    value_pair = (at_least_two & ((m + 0x00FC00FCu) << 6)) | (c.nonzero & ~at_least_two & 0x3F003F00u) | c.sign;
  }
  return m | (c.sign >> 12);
}

// Four classify_pair_nibbles results (elements 2i at bits 0..3, 2i+1 at 16..19 of c[i]) -> 8 codes
// in 5 instructions: c0 | c1 << 8 has e0 e2 e1 e3 at nibbles 0 2 4 6, folding the high half down by
// 12 bits interleaves them into e0 e1 e2 e3 (no bits overlap, so the adds are ors), and one byte
// permute joins the two low halves.
__device__ __forceinline__ uint32_t pack_nibble_pairs(const uint32_t (&c)[4]) {
  const uint32_t lo = c[0] + (c[1] << 8), hi = c[2] + (c[3] << 8);
  return __byte_perm(lo + (lo >> 12), hi + (hi >> 12), 0x5410);
}

// Thresholds of one block as 16-bit pairs (Pair16 above); ok == false: d == 0 or outside the exact
// range, the caller takes the FP32 path.
template <typename T>
struct PackedThresholds {
  uint32_t b[7];
  bool ok;
};

template <typename T>
__device__ __forceinline__ PackedThresholds<T> packed_thresholds(const nvfp4::BlockStep& step) {
  PackedThresholds<T> p;
  const E2M1Thresholds t = e2m1_thresholds(step.d);
  p.ok = step.d != 0.f && t.exact;
#pragma unroll
  for (int i = 0; i < 7; ++i) p.b[i] = Pair16<T>::round_up_pair(t.x[i]);
  return p;
}

// Packed classification of 4 words (8 elements) against a block's thresholds, the nibbles packed by
// pack_nibble_pairs; dq: value(code) * block scale in BF16 (exact, so the packed multiply's rounding never acts).
template <typename T>
__device__ __forceinline__ uint32_t classify_words_packed(const uint4& raw, const PackedThresholds<T>& p,
                                                          float block_scale, bool want_dq, uint4& dq) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t c[4];
  uint32_t values[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int i = 0; i < 4; ++i) c[i] = classify_pair_nibbles<T>(w[i], p.b, want_dq, values[i]);
  if (want_dq) {
    const __nv_bfloat162 scale = __float2bfloat162_rn(block_scale);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_bfloat162 h = __hmul2(Vec8<__nv_bfloat16>::as_pair(values[i]), scale);
      values[i] = *reinterpret_cast<const uint32_t*>(&h);
    }
    dq = make_uint4(values[0], values[1], values[2], values[3]);
  }
  return pack_nibble_pairs(c);
}

// A whole block (two Vec8 halves) with one threshold computation: codes of elements 0..7 in .x,
// 8..15 in .y.
template <typename T>
__device__ __forceinline__ uint2 quantize_block16(const Vec8<T>& lo, const Vec8<T>& hi, const nvfp4::BlockStep& step,
                                                  bool want_dq, uint4& dq_lo, uint4& dq_hi) {
  if constexpr (sizeof(T) == 2) {
    if (step.d != 0.f) {
      const PackedThresholds<T> p = packed_thresholds<T>(step);
      if (p.ok)
        return make_uint2(classify_words_packed<T>(lo.raw, p, step.scale, want_dq, dq_lo),
                          classify_words_packed<T>(hi.raw, p, step.scale, want_dq, dq_hi));
    }
  }
  float f[8];
  lo.to_float(f);
  const uint32_t c_lo = quantize_half_block(f, step).codes;
  hi.to_float(f);
  const uint32_t c_hi = quantize_half_block(f, step).codes;
  if (want_dq) {
    dq_lo = dequant_half_block_bf16(c_lo, step.scale);
    dq_hi = dequant_half_block_bf16(c_hi, step.scale);
  }
  return make_uint2(c_lo, c_hi);
}

// ---------------------------------------------------------------------------------------------
// Fast path for a row (or expert) whose FP32 scale s makes every block step safe without checks:
// s in [2^-40, 2^37] (row_scale_fast). Then six_s = 6 s is a Markstein divisor (nvfp4::Divisor),
// every nonzero d = float(b) s lies in [2^-49, 2^46] where the packed thresholds are exact, and a
// block whose E4M3 scale rounds to 0 (d == 0) is given d = 2^100: its thresholds all exceed any
// |x| <= 2688 s, so its codes come out +0 with no branch. For BF16, the thresholds of t = 2.5, 3.5
// and 5 are those of 1.25, 1.75 and 1.25 with the exponent field raised by 1, 1 and 2: doubling d's
// multiple doubles the half-ulp offset too, so every FP32 step of e2m1_thresholds scales exactly
// by 2 (all values normal here), and so does rounding up to BF16.
// Bit for bit block_step + quantize_block16.
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ bool row_scale_fast(float s) { return s >= 0x1p-40f && s <= 0x1p37f; }

// max |x| of a whole block (two Vec8 halves), NaN-propagating.
template <typename T>
__device__ __forceinline__ float block16_abs_max(const Vec8<T>& lo, const Vec8<T>& hi) {
  if constexpr (sizeof(T) == 2) return Vec8<T>::fold_pair(Vec8<T>::max_pair(lo.abs_max_pair(), hi.abs_max_pair()));
  else return nvfp4::fmax_nan(lo.abs_max(), hi.abs_max());
}

// Each of n whole blocks' max |x| into block_amax; returns their max (NaN-propagating).
template <typename T, int n>
__device__ __forceinline__ float blocks16_abs_max(const Vec8<T> (&v)[n][2], float (&block_amax)[n]) {
  float amax = 0.f;
#pragma unroll
  for (int k = 0; k < n; ++k) {
    block_amax[k] = block16_abs_max<T>(v[k][0], v[k][1]);
    amax = nvfp4::fmax_nan(amax, block_amax[k]);
  }
  return amax;
}

// block_step for row_scale_fast(s): the division by six_s is Markstein's (exact here: the block amax
// is 0 or below 2^49; one under 2^-80 gives a quotient under 2^-42, which E4M3 rounds to 0 anyway).
__device__ __forceinline__ nvfp4::BlockStep block_step_fast(float block_amax, float s, const nvfp4::Divisor& six_s) {
  const float q = block_amax < 0x1p-80f ? 0.f : nvfp4::div_rn_fast(block_amax, six_s);
  nvfp4::BlockStep out;
  out.scale_bits = nvfp4::e4m3_round(q, &out.scale);
  out.d = out.scale * s;
  return out;
}

// The packed thresholds of a fast-path block step (see above); 16-bit element types only.
template <typename T>
__device__ __forceinline__ PackedThresholds<T> fast_thresholds(const nvfp4::BlockStep& step) {
  PackedThresholds<T> p;
  p.ok = true;
  const float d = step.d == 0.f ? 0x1p100f : step.d;
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    constexpr uint32_t kExponentStep = 0x00800080u;  // x2 on both BF16 halves
    p.b[0] = Pair16<T>::round_up_pair(succ_positive(__fmaf_rd(0.25f, d, d * 0x1p-26f)));
    p.b[1] = Pair16<T>::round_up_pair(__fmaf_ru(0.75f, d, -(d * 0x1p-25f)));
    p.b[2] = Pair16<T>::round_up_pair(succ_positive(__fmaf_rd(1.25f, d, d * 0x1p-24f)));
    p.b[3] = Pair16<T>::round_up_pair(__fmaf_ru(1.75f, d, -(d * 0x1p-24f)));
    p.b[4] = p.b[2] + kExponentStep;
    p.b[5] = p.b[3] + kExponentStep;
    p.b[6] = p.b[2] + 2 * kExponentStep;
  } else {  // FP16 thresholds may be subnormal or infinite: each one computed
    const E2M1Thresholds t = e2m1_thresholds(d);
#pragma unroll
    for (int i = 0; i < 7; ++i) p.b[i] = Pair16<T>::round_up_pair(t.x[i]);
  }
  return p;
}

// One block on the fast path: codes of elements 0..7 in .x, 8..15 in .y, and (kDq) the BF16
// "code x block scale" operand; the same bits as quantize_block16(lo, hi, block_step(...)).
template <typename T, bool kDq>
__device__ __forceinline__ uint2 quantize_block16_fast(const Vec8<T>& lo, const Vec8<T>& hi, const nvfp4::BlockStep& step,
                                                       uint4& dq_lo, uint4& dq_hi) {
  if constexpr (sizeof(T) == 2) {
    const PackedThresholds<T> p = fast_thresholds<T>(step);
    return make_uint2(classify_words_packed<T>(lo.raw, p, step.scale, kDq, dq_lo),
                      classify_words_packed<T>(hi.raw, p, step.scale, kDq, dq_hi));
  } else {
    return quantize_block16<T>(lo, hi, step, kDq, dq_lo, dq_hi);
  }
}

}  // namespace trace_kernels
