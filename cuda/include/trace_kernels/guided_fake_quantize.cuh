// Guided fake quantization (TRACE, docs/numerics.md): trainer x [rows, D] + the rollout's guidance
// (row scales, E4M3 block scales, and mantissa bits [rows, D/8] (compact) or codes [rows, D/2]
// (full)) -> value(chosen code) * d in x's dtype, plus audit counters:
//   counters[0] elements, [1] chosen code != round-to-nearest code (guidance changed the rounding),
//   [2] chosen == rollout code, [3] round-to-nearest == rollout code (full guidance only).
//
// The block arithmetic the kernels share (guided_fake_quantize_v4.cuh: v4's software-pipelined loop;
// _v5.cuh: the trainer's call, v6; _v7.cuh: the audit calls, v7):
// - no division and no per-element FP32 work for BF16/FP16: each thread takes whole 16-element blocks
//   in a grid-stride (persistent) loop; per block, exact 16-bit thresholds on |x| and the 8 possible
//   outputs are computed once, then two elements per instruction are classified by a 3-level packed
//   search whose thresholds the guidance picks, its third level and output by prmt table lookups
//   (guided_pair_tables); counters are reduced per CTA (one atomic per counter per CTA);
// - FP32 input, blocks outside the exact range and non-finite blocks take the per-element path
//   (guided_half_block_exact: the chosen grid value straight from the FP32 bits of min(|y|, 6),
//   guided_compact_bits / guided_full_bits).
// v1 and v2 (per-element kernels), v3's LOP3 search and v4 / v5 as launched kernels lost to v6 / v7 on
// the H200 and were removed (docs/toolchain.md); the names v3..v7 stay on the pieces they built.
#pragma once

#include <stdint.h>

#include <type_traits>

#include "trace_kernels/nvfp4.cuh"
#include "trace_kernels/quantize_epilogue.cuh"
#include "trace_kernels/status.cuh"
#include "trace_kernels/vec.cuh"

namespace trace_kernels {

// Non-finite input in half block g: its row and first column go to the status word.
template <class Cfg>
__device__ __forceinline__ void report_nonfinite_half_block(uint32_t* __restrict__ status, int64_t g,
                                                            const float (&f)[8]) {
  const int64_t row = g / Cfg::kHalfBlocksPerRow;
  report_nonfinite(status, kStatusGuidedFakeQuantize, static_cast<uint64_t>(row),
                   static_cast<uint32_t>(g % Cfg::kHalfBlocksPerRow) * 8, f);
}

// ---------------------------------------------------------------------------------------------
// v2
// ---------------------------------------------------------------------------------------------

// The chosen grid value straight from FP32 bit patterns, a = min(|y|, 6). For a >= 1 the grid
// points 1, 1.5, 2, 3, 4, 6 are the FP32 values whose bits are multiples of 2^22: clearing the low
// 22 bits floors, adding 2^22 - 1 first ceils (floor == ceil on the grid), and bit 22 is the
// floor's mantissa bit. Below 1 the grid 0, 0.5, 1 has the step of [1, 2) and the same mantissa
// bits as 1, 1.5, 2, so a < 1 is shifted by +1 with directed rounding (RD(a+1) floors and RU(a+1)
// ceils exactly like the exact a + 1 would, the grid points being FP32 values), rounded there and
// shifted back (exact). tests/test_ops_cpu.py ports both functions and checks them against the
// definition on every FP32 pattern within 64 ulps of each grid point and midpoint.
//
// Compact: round up iff the floor's mantissa bit differs from the guidance bit. Returns FP32 bits.
// bit22: the guidance bit at bit 22 (other bits ignored), so one LOP3 compares it with the floor's.
// count: also add to `changed` whether round-to-nearest (ties to the even mantissa bit) differs,
// computed in the same shifted domain; when a + 1 was inexact (RD != RU) the true value lies
// strictly above RD, which a sticky 1 in the carry trick accounts for.
__device__ __forceinline__ uint32_t guided_compact_bits(float a, uint32_t bit22, bool count, uint32_t& changed) {
  const float offset = a < 1.f ? 1.f : 0.f;
  const uint32_t lo = __float_as_uint(__fadd_rd(a, offset));
  const uint32_t hi = __float_as_uint(__fadd_ru(a, offset));
  const uint32_t rounded = ((lo ^ bit22) & 0x400000u ? hi + 0x3FFFFFu : lo) & 0xFFC00000u;
  if (count) {
    const uint32_t sticky_or_parity = ((lo >> 22) & 1u) | (lo != hi ? 1u : 0u);
    changed += rounded != ((lo + 0x1FFFFFu + sticky_or_parity) & 0xFFC00000u);
  }
  return __float_as_uint(__uint_as_float(rounded) - offset);
}

// Full guidance: away from zero iff the rollout's code lies beyond the floor on y's side (in the
// shifted domain: value(code) + offset is exact). Counters as the op defines them: changed, chosen == rollout,
// nearest == rollout (a zero matches either sign).
__device__ __forceinline__ uint32_t guided_full_bits(float a, uint32_t y_sign, uint32_t code, bool count,
                                                     uint32_t& changed, uint32_t& guided_eq, uint32_t& nearest_eq) {
  const float offset = a < 1.f ? 1.f : 0.f;
  const uint32_t lo = __float_as_uint(__fadd_rd(a, offset));
  const uint32_t hi = __float_as_uint(__fadd_ru(a, offset));
  const uint32_t rollout_bits = nvfp4::e2m1_value_bits(code & 7u);
  const uint32_t rollout_shifted = __float_as_uint(__uint_as_float(rollout_bits) + offset);
  const bool same_sign = ((code << 28) & 0x80000000u) == y_sign;
  const uint32_t rounded =
      (same_sign && rollout_shifted > (lo & 0xFFC00000u) ? hi + 0x3FFFFFu : lo) & 0xFFC00000u;
  const uint32_t chosen = __float_as_uint(__uint_as_float(rounded) - offset);
  if (count) {
    const uint32_t nearest_shifted = (lo + 0x1FFFFFu + (((lo >> 22) & 1u) | (lo != hi ? 1u : 0u))) & 0xFFC00000u;
    const uint32_t nearest = __float_as_uint(__uint_as_float(nearest_shifted) - offset);
    changed += rounded != nearest_shifted;
    guided_eq += chosen == rollout_bits && (chosen == 0u || same_sign);
    nearest_eq += nearest == rollout_bits && (nearest == 0u || same_sign);
  }
  return chosen;
}

// ---------------------------------------------------------------------------------------------
// v3
// ---------------------------------------------------------------------------------------------
//
// Let q = RN(|x| / d) and g_0..g_7 = 0, .5, 1, 1.5, 2, 3, 4, 6. q is monotone in |x|, so
//   A_j = min{|x| : q >= g_j}  = RU((g_j - hb_j) d)        (hb_j: half an ulp below g_j; the tie
//   B_j = min{|x| : q >  g_j}  = succ(RD((g_j + ha_j) d))  at g -+ h goes to g's even significand)
// (ha_j: half an ulp above g_j), and for a 16-bit x, x >= T <=> x >= RU16(T). Guided rounding
// picks m >= j exactly when |x| >= B_{j-1} (q above g_{j-1}) if the guidance wants the upper
// neighbour of that gap, else when |x| >= A_j (q reached g_j):
//   compact: wants it iff j's mantissa bit (j & 1) equals the guidance bit;
//   full:    iff r >= j, r = the rollout's magnitude index if its sign is x's, else 0
//            (then m = clamp(r, floor(q), ceil(q)): the reference's rule, nvfp4.guided_quantize).
// So m comes from a 3-level search over 7 thresholds, each chosen between B_{j-1} and A_j by the
// guidance, and the output from a select tree over the block's 8 outputs RN16(RN32(g_m d)) | sign
// (the FP32 product rounded once to 16 bits, as the reference's dequantize then .to(dtype)).
// Exact while d in [2^-100, 2^17): the h d products are normal, every threshold is a normal
// 16-bit value, RN16(2^-133..) shows B_0 is the smallest positive 16-bit value (d < 2^17), and
// for BF16 the thresholds and outputs of g = 2^k, 1.5 * 2^k are those of g = 1, 1.5 with the
// exponent field moved (+0x80 per doubling), which the block setup uses. tests/test_ops_cpu.py
// ports this construction and checks it against trace_kernels.nvfp4 on every BF16 pattern.

constexpr int kV3Bf16ExponentStep = 0x00800080;  // x2 on both BF16 halves

// Per-block constants of v3, every value a 16-bit pair (both halves equal).
struct GuidedBlockV3 {
  uint32_t a[8];     // a[j] = RU16(A_j), j = 1..7 (a[0] unused)
  uint32_t b[7];     // b[j] = RU16(B_j), j = 0..6
  uint32_t out[8];   // out[m] = RN16(RN32(g_m d)) | sign bits, m = 1..7 (out[0] = 0)
  uint32_t mid[7];   // round-to-nearest thresholds (packed_thresholds), negated, counters only
                     // (the FMA-pipe count, guided_count_pair)
  bool ok;           // d in the exact range
};

template <typename T>
__device__ __forceinline__ uint32_t round_nearest_pair(float v);

template <>
__device__ __forceinline__ uint32_t round_nearest_pair<__nv_bfloat16>(float v) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(v, v);
  return *reinterpret_cast<const uint32_t*>(&h);
}

template <>
__device__ __forceinline__ uint32_t round_nearest_pair<__half>(float v) {
  const __half2 h = __floats2half2_rn(v, v);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// RU16(A) and RU16(B) of grid value g, with hb d and ha d given (exact powers-of-two multiples of d).
template <typename T>
__device__ __forceinline__ uint32_t grid_threshold_a(float g, float d, float hb_d) {
  return Pair16<T>::round_up_pair(__fmaf_ru(g, d, -hb_d));
}

template <typename T>
__device__ __forceinline__ uint32_t grid_threshold_b(float g, float d, float ha_d) {
  return Pair16<T>::round_up_pair(succ_positive(__fmaf_rd(g, d, ha_d)));
}

template <typename T>
__device__ __forceinline__ GuidedBlockV3 guided_block_v3(float d, bool count) {
  GuidedBlockV3 c;
  c.ok = d >= 0x1p-100f && d < 0x1p17f;
  const float d22 = d * 0x1p-22f, d23 = d * 0x1p-23f, d24 = d * 0x1p-24f, d25 = d * 0x1p-25f;
  constexpr uint32_t kSign = 0x80008000u;
  c.a[0] = 0u;
  c.b[0] = 0x00010001u;  // the smallest positive 16-bit value (d < 2^17: 2^-150 d is below it)
  c.out[0] = 0u;
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    constexpr uint32_t e = kV3Bf16ExponentStep;
    c.a[2] = grid_threshold_a<T>(1.f, d, d25);
    c.a[3] = grid_threshold_a<T>(1.5f, d, d24);
    c.b[2] = grid_threshold_b<T>(1.f, d, d24);
    c.b[3] = grid_threshold_b<T>(1.5f, d, d24);
    c.out[2] = round_nearest_pair<T>(d) | kSign;
    c.out[3] = round_nearest_pair<T>(1.5f * d) | kSign;
    c.a[1] = c.a[2] - e;  c.a[4] = c.a[2] + e;  c.a[6] = c.a[2] + 2 * e;
    c.a[5] = c.a[3] + e;  c.a[7] = c.a[3] + 2 * e;
    c.b[1] = c.b[2] - e;  c.b[4] = c.b[2] + e;  c.b[6] = c.b[2] + 2 * e;
    c.b[5] = c.b[3] + e;
    c.out[1] = c.out[2] - e;  c.out[4] = c.out[2] + e;  c.out[6] = c.out[2] + 2 * e;
    c.out[5] = c.out[3] + e;  c.out[7] = c.out[3] + 2 * e;
  } else {  // FP16: thresholds may be subnormal or infinite there, so each one is computed
    const float d26 = d * 0x1p-26f;
    c.a[1] = grid_threshold_a<T>(0.5f, d, d26);
    c.a[2] = grid_threshold_a<T>(1.f, d, d25);
    c.a[3] = grid_threshold_a<T>(1.5f, d, d24);
    c.a[4] = grid_threshold_a<T>(2.f, d, d24);
    c.a[5] = grid_threshold_a<T>(3.f, d, d23);
    c.a[6] = grid_threshold_a<T>(4.f, d, d23);
    c.a[7] = grid_threshold_a<T>(6.f, d, d22);
    c.b[1] = grid_threshold_b<T>(0.5f, d, d25);
    c.b[2] = grid_threshold_b<T>(1.f, d, d24);
    c.b[3] = grid_threshold_b<T>(1.5f, d, d24);
    c.b[4] = grid_threshold_b<T>(2.f, d, d23);
    c.b[5] = grid_threshold_b<T>(3.f, d, d23);
    c.b[6] = grid_threshold_b<T>(4.f, d, d22);
    const float g[8] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
#pragma unroll
    for (int m = 1; m < 8; ++m) c.out[m] = round_nearest_pair<T>(g[m] * d) | kSign;
  }
  if (count) {
    const E2M1Thresholds t = e2m1_thresholds(d);
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {  // 2.5, 5 and 3.5: 1.25 and 1.75 moved (as above)
      constexpr uint32_t e = kV3Bf16ExponentStep;
#pragma unroll
      for (int i = 0; i < 4; ++i)  // (the exponent steps hold for negated values too: the sign is bit 15)
        c.mid[i] = Pair16<T>::negated_round_up_pair(t.x[i]);
      c.mid[4] = c.mid[2] + e;  c.mid[6] = c.mid[2] + 2 * e;  c.mid[5] = c.mid[3] + e;
    } else {
#pragma unroll
      for (int i = 0; i < 7; ++i)
        c.mid[i] = Pair16<T>::negated_round_up_pair(t.x[i]);
    }
  }
  return c;
}

// Packed counters of v3: 16-bit lanes, folded into 32 bits once per pass.
struct GuidedCountsV3 {
  uint32_t changed = 0, guided_eq = 0, nearest_eq = 0;
};

// The changed bits of two elements (mask at the sign bits, 15 and 31) given the guided search's m
// parity k0: round-to-nearest's index differs from the guided one by at most 1, so they differ exactly
// when their parities do. Nearest's index is the number of its 7 thresholds at or below |x|, so its
// parity is the XOR of the 7 comparisons, made on the FMA pipe (below_signs; c.mid negated), which the
// search leaves idle (v3 made them on the ALU pipe by a second 3-level search).
template <typename T>
__device__ __forceinline__ uint32_t nearest_changed_signs(uint32_t a, const GuidedBlockV3& c, uint32_t k0) {
  uint32_t below = ~k0;  // XOR_j (|x| < mid_j) = ~nearest's parity (7 terms), and ~k0
#pragma unroll
  for (int j = 0; j < 7; ++j) below ^= below_signs<T>(a, c.mid[j]);
  return below & 0x80008000u;
}

// 2^17 in constant memory: with an immediate, ptxas turns add_sign_bits' multiply-add into LEA.HI (ALU pipe)
static __constant__ uint32_t kSignBitsToLanes = 1u << 17;

// counter + one per set sign bit of `signs` (bits 15, 31 only): (signs * 2^17) >> 32 moves bit 15 to
// bit 0 and bit 31 to bit 16, in one multiply-add on the FMA pipe (IMAD.HI)
__device__ __forceinline__ uint32_t add_sign_bits(uint32_t counter, uint32_t signs) {
  return __umulhi(signs, kSignBitsToLanes) + counter;
}

// The audit counters of two elements (packed, one per 16-bit lane) from the guided search's masks
// k2, k1, k0 (m's index bits) and the guidance masks g4, g2, g3 of its three levels (full guidance).
template <typename T, bool kFull>
__device__ __forceinline__ void guided_count_pair(uint32_t a, uint32_t guide, const GuidedBlockV3& c, uint32_t k2,
                                                  uint32_t k1, uint32_t k0, uint32_t g4, uint32_t g2, uint32_t g3,
                                                  GuidedCountsV3& n) {
  const uint32_t changed = nearest_changed_signs<T>(a, c, k0);
  n.changed = add_sign_bits(n.changed, changed);
  if (kFull) {
    // chosen == rollout: the search made the same decision for m and for r at every level, and
    // no nonzero rollout code of the other sign (z >= -(bits 0x0FFF) unless its index is nonzero
    // with a sign mismatch; the bits below 12 are not zero, so z >= 0 would not do)
    const uint32_t differs = (k2 ^ g4) | (k1 ^ g2) | (k0 ^ g3);
    const uint32_t sign_ok = Pair16<T>::ge(guide, 0x8FFF8FFFu);
    const uint32_t guided_eq = sign_ok & ~differs & 0x80008000u;
    n.guided_eq = add_sign_bits(n.guided_eq, guided_eq);
    // nearest == rollout: nearest lies in [floor, ceil] and chosen = clamp(r, floor, ceil)
    n.nearest_eq = add_sign_bits(n.nearest_eq, guided_eq & ~changed);
  }
}

// prmt.b32 in its default mode: a selector nibble with bit 3 set replicates the top bit of its byte.
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(selector));
  return r;
}

// ---------------------------------------------------------------------------------------------
// v6 / v7: v3's search with its third level and its output picked by prmt
// ---------------------------------------------------------------------------------------------
//
// v3's third level selects 1 of 8 thresholds and its output 1 of 8 values by trees of 7 LOP3 each.
// Both choices are an entry q = 2 k2 + k1 (levels 1 and 2) of 4-entry tables of 16-bit values, one
// table per guidance bit (thresholds B_{j-1} / A_j at j = 2q + 1) and per k0 (outputs m = 2q,
// 2q + 1). A table is 8 bytes in two registers, entry q at bytes 2q, 2q + 1, and one prmt picks
// an entry per lane: 4 instructions build the selector, then 2 prmt + 1 select replace each tree
// (20 instead of 24 per pair of elements). The thresholds and outputs are v3's. v6 uses them for
// compact guidance without counters, v7 for full guidance and the counted modes as well.

// Two 4-entry tables of 16-bit values per choice: {lo, hi} registers, entry q at bytes 2q, 2q + 1.
struct GuidedTablesV6 {
  uint32_t lower[2];  // B_0, B_2, B_4, B_6 (guidance bit 1: the lower neighbour's B)
  uint32_t upper[2];  // A_1, A_3, A_5, A_7 (guidance bit 0)
  uint32_t even[2];   // outputs m = 0, 2, 4, 6 (sign bits set, out[0] = 0)
  uint32_t odd[2];    // outputs m = 1, 3, 5, 7
};

// From v3's 16-bit pairs (both halves equal); halves(x, y): the low half of x, the high half of y.
template <typename T>
__device__ __forceinline__ GuidedTablesV6 guided_tables_v6(const GuidedBlockV3& c) {
  const auto halves = [](uint32_t x, uint32_t y) { return select_bits(0xFFFFu, x, y); };
  GuidedTablesV6 t;
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    // x2 and x4 of a pair's value in the two halves (the exponent steps of guided_block_v3)
    constexpr uint32_t kTimes2And4 = kV3Bf16ExponentStep + (kV3Bf16ExponentStep & 0xFFFF0000u);
    t.lower[0] = halves(c.b[0], c.b[2]);
    t.lower[1] = c.b[2] + kTimes2And4;
    t.upper[0] = halves(c.a[1], c.a[3]);
    t.upper[1] = c.a[3] + kTimes2And4;
    t.even[0] = c.out[2] & 0xFFFF0000u;
    t.even[1] = c.out[2] + kTimes2And4;
    t.odd[0] = halves(c.out[1], c.out[3]);
    t.odd[1] = c.out[3] + kTimes2And4;
  } else {
    t.lower[0] = halves(c.b[0], c.b[2]);
    t.lower[1] = halves(c.b[4], c.b[6]);
    t.upper[0] = halves(c.a[1], c.a[3]);
    t.upper[1] = halves(c.a[5], c.a[7]);
    t.even[0] = c.out[2] & 0xFFFF0000u;
    t.even[1] = halves(c.out[4], c.out[6]);
    t.odd[0] = halves(c.out[1], c.out[3]);
    t.odd[1] = halves(c.out[5], c.out[7]);
  }
  return t;
}

// Two elements (one 32-bit word w) -> their outputs as a 16-bit pair: v3's search with the third level and the
// output from the tables; the counters when asked (v7).
// guide: compact: a mask, all ones in a half whose guidance bit is 1; full: the rollout code as a
// 16-bit number per half, z = sign (rollout's sign xor x's sign) | magnitude index at bits 12..14
// (bits below 12 arbitrary, at most bit 7 of the exponent; so z >= j << 12 <=> r >= j, and a
// sign mismatch is negative: r = 0).
template <typename T, bool kFull>
__device__ __forceinline__ uint32_t guided_pair_tables(uint32_t w, uint32_t guide, const GuidedBlockV3& c,
                                                       const GuidedTablesV6& t, bool count, GuidedCountsV3& n) {
  const uint32_t a = w & 0x7fff7fffu;
  // levels 1 and 2: v3's (full guidance compares the rollout's index with each level's j)
  const uint32_t g4 = kFull ? Pair16<T>::ge(guide, 0x40004000u) : ~guide;
  // (compact: the same selects written with guide as the mask)
  const uint32_t k2 =                                                       // m >= 4
      Pair16<T>::ge(a, kFull ? select_bits(g4, c.b[3], c.a[4]) : select_bits(guide, c.a[4], c.b[3]));
  const uint32_t j2 = select_bits(k2, 0x60006000u, 0x20002000u);
  const uint32_t g2 = kFull ? Pair16<T>::ge(guide, j2) : ~guide;
  const uint32_t upper2 = select_bits(k2, c.a[6], c.a[2]), lower2 = select_bits(k2, c.b[5], c.b[1]);
  const uint32_t k1 =                                                       // m >= 6 | 2
      Pair16<T>::ge(a, kFull ? select_bits(g2, lower2, upper2) : select_bits(guide, upper2, lower2));
  const uint32_t g3 = kFull ? Pair16<T>::ge(guide, j2 - 0x10001000u + (k1 & 0x20002000u)) : guide;
  // prmt selector: nibbles 2 q0, 2 q0 + 1 (the low lane's entry), 2 q1, 2 q1 + 1 (the high lane's)
  const uint32_t q = (k2 & 0x00440044u) | (k1 & 0x00220022u);
  const uint32_t sel = q | (q >> 8) | 0x1010u;
  const uint32_t k0 = Pair16<T>::ge(                                        // m odd
      a, select_bits(g3, prmt(t.lower[0], t.lower[1], sel), prmt(t.upper[0], t.upper[1], sel)));
  const uint32_t value = select_bits(k0, prmt(t.odd[0], t.odd[1], sel), prmt(t.even[0], t.even[1], sel));
  if (count) guided_count_pair<T, kFull>(a, guide, c, k2, k1, k0, g4, g2, g3, n);
  return value & (w | 0x7fff7fffu);  // x's sign on the nonzero outputs (a zero stays +0)
}

// Guidance bits 4q..4q+3 at the top bit of bytes 0..3 (the four 4-bit shifted copies never overlap).
__device__ __forceinline__ uint32_t spread_bits_to_byte_tops(uint32_t bits4) { return bits4 * 0x10204081u; }

// The per-element arithmetic for one half block (FP32 input, blocks outside v3's exact range,
// d == 0, non-finite input): the removed v2 kernel's, same results and counter contributions.
template <class Cfg>
__device__ __forceinline__ void guided_half_block_exact(const Vec8<typename Cfg::T>& v, uint32_t guide, float d,
                                                        bool full, bool count, int64_t g,
                                                        typename Cfg::T* __restrict__ out,
                                                        uint32_t* __restrict__ status, uint32_t& n_elems,
                                                        uint32_t& n_changed, uint32_t& n_guided_eq,
                                                        uint32_t& n_nearest_eq) {
  float f[8];
  v.to_float(f);
  float amax = fabsf(f[0]);
#pragma unroll
  for (int j = 1; j < 8; ++j) amax = nvfp4::fmax_nan(amax, fabsf(f[j]));
  if (!nvfp4::is_finite(amax)) {
    report_nonfinite_half_block<Cfg>(status, g, f);
    return;  // these 8 outputs stay unwritten; the status flag says why
  }
  n_elems += 8;
  float y8[8];
  if (d == 0.f) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      y8[j] = 0.f;
      if (full && count) {
        const bool zero = (guide >> (4 * j) & 7u) == 0u;
        n_guided_eq += zero;
        n_nearest_eq += zero;
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float q = __fdiv_rn(f[j], d);
      const uint32_t y_sign = __float_as_uint(q) & 0x80000000u;
      const float a = fminf(fabsf(q), nvfp4::kFp4Max);
      const uint32_t chosen =
          full ? guided_full_bits(a, y_sign, (guide >> (4 * j)) & 0xFu, count, n_changed, n_guided_eq, n_nearest_eq)
               : guided_compact_bits(a, guide << (22 - j), count, n_changed);
      y8[j] = fmaf(__uint_as_float(chosen | y_sign), d, 0.f);
    }
  }
  store8<typename Cfg::T>(out + g * 8, y8);
}

// One block of 16 elements on the fast path (16-bit input, d in the exact range, all finite);
// returns false, writing nothing, when the block needs guided_half_block_exact instead.
template <class Cfg, bool kFull>
__device__ __forceinline__ bool guided_block_v3(const Vec8<typename Cfg::T> (&v)[2], uint2 guide, float d, bool count,
                                                int64_t blk, typename Cfg::T* __restrict__ out,
                                                GuidedCountsV3& packed) {
  using T = typename Cfg::T;
  if constexpr (sizeof(T) == 2) {
    const GuidedBlockV3 c = guided_block_v3<T>(d, count);
    // non-finite 16-bit |x| <=> exponent all ones <=> |x| + (lowest exponent bit) carries into bit 15
    constexpr uint32_t kExpLsb = std::is_same<T, __nv_bfloat16>::value ? 0x00800080u : 0x04000400u;
    const uint32_t w[8] = {v[0].raw.x, v[0].raw.y, v[0].raw.z, v[0].raw.w,
                           v[1].raw.x, v[1].raw.y, v[1].raw.z, v[1].raw.w};
    uint32_t nonfinite = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) nonfinite |= (w[i] & 0x7fff7fffu) + kExpLsb;
    const bool fast = c.ok && d != 0.f && !(nonfinite & 0x80008000u);
    if (!fast) return false;
    uint32_t src[4];  // compact: guidance bits at byte tops; full: codes prepared for guided_pair_tables
    if (kFull) {
      src[0] = (guide.x << 4) & 0xF0F0F0F0u;  // even elements' codes at the top nibble of bytes
      src[1] = guide.x & 0xF0F0F0F0u;         // odd elements' codes
      src[2] = (guide.y << 4) & 0xF0F0F0F0u;
      src[3] = guide.y & 0xF0F0F0F0u;
    } else {
#pragma unroll
      for (int q = 0; q < 4; ++q) src[q] = spread_bits_to_byte_tops((guide.x >> (4 * q)) & 0xFu);
    }
    uint32_t o[8];
    const GuidedTablesV6 tables = guided_tables_v6<T>(c);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      uint32_t gp;
      if (kFull) {  // byte i of the codes: low nibble -> bits 12..15, high nibble -> bits 28..31
        const uint32_t k = i & 3;
        const uint32_t s = prmt(src[2 * (i >> 2)], src[2 * (i >> 2) + 1], k | k << 4 | (k + 4) << 8 | (k + 4) << 12);
        gp = s ^ (w[i] & 0x80008000u);
      } else {  // bits 2i, 2i+1 -> all-ones halves (prmt's sign replication)
        const uint32_t b = (2 * i) & 3;
        gp = prmt(src[i >> 1], 0u, (b | 8) * 0x11 | ((b + 1) | 8) * 0x1100);
      }
      o[i] = guided_pair_tables<T, kFull>(w[i], gp, c, tables, count, packed);
    }
    *reinterpret_cast<uint4*>(out + blk * 16) = make_uint4(o[0], o[1], o[2], o[3]);
    *reinterpret_cast<uint4*>(out + blk * 16 + 8) = make_uint4(o[4], o[5], o[6], o[7]);
    return true;
  } else {
    return false;
  }
}

// Sum of a packed 16-bit-lane counter.
__device__ __forceinline__ uint32_t lane_sum(uint32_t v) { return (v & 0xFFFFu) + (v >> 16); }

// Counters of a CTA: warp sums, then one shared-memory slot per warp, one atomic per counter.
template <int CTA>
__device__ __forceinline__ void flush_counters_cta(unsigned long long* __restrict__ counters, const uint32_t (&n)[4]) {
  __shared__ uint32_t partial[CTA / 32][4];
  const int warp = threadIdx.x / 32;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t s = __reduce_add_sync(0xffffffffu, n[i]);
    if (threadIdx.x % 32 == 0) partial[warp][i] = s;
  }
  __syncthreads();
  if (threadIdx.x < 4) {
    unsigned long long total = 0;
#pragma unroll
    for (int k = 0; k < CTA / 32; ++k) total += partial[k][threadIdx.x];
    if (total) atomicAdd(counters + threadIdx.x, total);
  }
}

// The end of a pass (v3's and v4's loops): the slots guided_block_v3 declined (bit k of `slow`: slot k, rare) on the
// exact per-element path, reloaded from memory, then the pass's packed counters folded into the lane's.
template <class Cfg, bool kFull>
__device__ __forceinline__ void guided_pass_tail(
    uint32_t slow, const GuidedCountsV3& packed, int64_t first, bool count, const typename Cfg::T* __restrict__ x,
    const float* __restrict__ row_scales, const uint8_t* __restrict__ block_scales,
    const uint8_t* __restrict__ mantissa_bits, const uint8_t* __restrict__ rollout_codes,
    typename Cfg::T* __restrict__ out, uint32_t* __restrict__ status, uint32_t& n_elems, uint32_t& n_changed,
    uint32_t& n_guided_eq, uint32_t& n_nearest_eq) {
  constexpr int kBlocksPerRow = Cfg::D / nvfp4::kBlock;
#pragma unroll 1
  for (; slow != 0; slow &= slow - 1) {
    const int64_t blk = first + static_cast<int64_t>(__ffs(slow) - 1) * Cfg::CTA;
    const float d_blk = nvfp4::e4m3_to_float(block_scales[blk]) * row_scales[blk / kBlocksPerRow];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      Vec8<typename Cfg::T> half;
      half.load(x + blk * 16 + 8 * h);
      const uint32_t g8 = kFull ? reinterpret_cast<const uint32_t*>(rollout_codes)[2 * blk + h]
                                : mantissa_bits[2 * blk + h];
      guided_half_block_exact<Cfg>(half, g8, d_blk, kFull, count, 2 * blk + h, out, status, n_elems, n_changed,
                                   n_guided_eq, n_nearest_eq);
    }
  }
  if (count) {  // at most 8 * kSlots per lane per pass: no overflow
    n_changed += lane_sum(packed.changed);
    n_guided_eq += lane_sum(packed.guided_eq);
    n_nearest_eq += lane_sum(packed.nearest_eq);
  }
}

template <class Cfg, bool kFull>
__device__ __forceinline__ void guided_fake_quantize_rows_v3(
    const typename Cfg::T* __restrict__ x, const float* __restrict__ row_scales,
    const uint8_t* __restrict__ block_scales, const uint8_t* __restrict__ mantissa_bits,
    const uint8_t* __restrict__ rollout_codes, typename Cfg::T* __restrict__ out,
    unsigned long long* __restrict__ counters, int rows, uint32_t* __restrict__ status) {
  using T = typename Cfg::T;
  constexpr int kBlocksPerRow = Cfg::D / nvfp4::kBlock;
  const int64_t total = static_cast<int64_t>(rows) * kBlocksPerRow;  // blocks
  const int64_t stride = static_cast<int64_t>(gridDim.x) * Cfg::CTA * Cfg::kSlots;
  const bool count = counters != nullptr;
  uint32_t n_elems = 0, n_changed = 0, n_guided_eq = 0, n_nearest_eq = 0;

  for (int64_t first = static_cast<int64_t>(blockIdx.x) * Cfg::CTA * Cfg::kSlots + threadIdx.x; first < total;
       first += stride) {
    Vec8<T> v[Cfg::kSlots][2];
    uint2 guide[Cfg::kSlots];  // compact: 16 bits in .x; full: 16 codes
    float d[Cfg::kSlots];
#pragma unroll
    for (int k = 0; k < Cfg::kSlots; ++k) {  // every load of the pass before the first use
      const int64_t blk = first + static_cast<int64_t>(k) * Cfg::CTA;
      if (blk < total) {
        v[k][0].load_stream(x + blk * 16);
        v[k][1].load_stream(x + blk * 16 + 8);
        if (kFull) guide[k] = __ldg(reinterpret_cast<const uint2*>(rollout_codes) + blk);
        else guide[k] = make_uint2(__ldg(mantissa_bits + 2 * blk) | __ldg(mantissa_bits + 2 * blk + 1) << 8, 0u);
        d[k] = nvfp4::e4m3_to_float(__ldg(block_scales + blk)) * __ldg(row_scales + blk / kBlocksPerRow);
      }
    }
    GuidedCountsV3 packed;
    uint32_t slow = 0;  // slots left to the exact per-element path (rare: reloaded below)
#pragma unroll
    for (int k = 0; k < Cfg::kSlots; ++k) {
      const int64_t blk = first + static_cast<int64_t>(k) * Cfg::CTA;
      if (blk < total) {
        if (guided_block_v3<Cfg, kFull>(v[k], guide[k], d[k], count, blk, out, packed)) n_elems += 16;
        else slow |= 1u << k;
      }
    }
    guided_pass_tail<Cfg, kFull>(slow, packed, first, count, x, row_scales, block_scales, mantissa_bits,
                                 rollout_codes, out, status, n_elems, n_changed, n_guided_eq, n_nearest_eq);
  }
  if (count) {
    const uint32_t n[4] = {n_elems, n_changed, n_guided_eq, n_nearest_eq};
    flush_counters_cta<Cfg::CTA>(counters, n);
  }
}

}  // namespace trace_kernels
