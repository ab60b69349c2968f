// Guided fake quantization (TRACE, docs/numerics.md): trainer x [rows, D] + the rollout's guidance
// (row scales, E4M3 block scales, and mantissa bits [rows, D/8] (compact) or codes [rows, D/2]
// (full)) -> value(chosen code) * d in x's dtype, plus audit counters:
//   counters[0] elements, [1] chosen code != round-to-nearest code (guidance changed the rounding),
//   [2] chosen == rollout code, [3] round-to-nearest == rollout code (full guidance only).
//
// No row reduction: each thread takes KSLOTS half blocks strided by the CTA's width, so
// consecutive lanes read consecutive 16-byte vectors. Two variants (GuidedConfig::kVariant):
// v1: per element, the grid position of y = x / d (nvfp4::grid_position), index arithmetic.
// v2: per element, the chosen grid value straight from the FP32 bits of min(|y|, 6)
//     (guided_compact_bits / guided_full_bits below: floor, ceil and nearest as bit patterns, the
//     range below 1 shifted onto [1, 2) with directed rounding), the Markstein range check once per
//     half block instead of per element, the sign by an FMA with +0.
#pragma once

#include <stdint.h>

#include "trace_kernels/nvfp4.cuh"
#include "trace_kernels/status.cuh"
#include "trace_kernels/vec.cuh"

namespace trace_kernels {

template <typename T_, int D_, int CTA_, int KSLOTS_, int VARIANT_ = 1>
struct GuidedConfig {
  using T = T_;
  static constexpr int D = D_;
  static constexpr int CTA = CTA_;
  static constexpr int kVariant = VARIANT_;
  static_assert(VARIANT_ == 1 || VARIANT_ == 2, "variants: 1, 2");
  static constexpr int kSlots = KSLOTS_;  // half blocks per thread
  static constexpr int kHalfBlocksPerRow = D / 8;
  static_assert(D % nvfp4::kBlock == 0, "D must be a multiple of 16");
  static_assert(CTA % 32 == 0, "whole warps");
};

// Non-finite input in half block g: its row and first column go to the status word.
template <class Cfg>
__device__ __forceinline__ void report_nonfinite_half_block(uint32_t* __restrict__ status, int64_t g,
                                                            const float (&f)[8]) {
  const int64_t row = g / Cfg::kHalfBlocksPerRow;
  report_nonfinite(status, kStatusGuidedFakeQuantize, static_cast<uint64_t>(row),
                   static_cast<uint32_t>(g % Cfg::kHalfBlocksPerRow) * 8, f);
}

// The audit counters: warp sums, then one 64-bit atomic per warp and nonzero counter.
__device__ __forceinline__ void flush_counters(unsigned long long* __restrict__ counters, uint32_t n_elems,
                                               uint32_t n_changed, uint32_t n_guided_eq, uint32_t n_nearest_eq) {
  n_elems = __reduce_add_sync(0xffffffffu, n_elems);
  n_changed = __reduce_add_sync(0xffffffffu, n_changed);
  n_guided_eq = __reduce_add_sync(0xffffffffu, n_guided_eq);
  n_nearest_eq = __reduce_add_sync(0xffffffffu, n_nearest_eq);
  if (threadIdx.x % 32 == 0) {
    if (n_elems) atomicAdd(counters + 0, static_cast<unsigned long long>(n_elems));
    if (n_changed) atomicAdd(counters + 1, static_cast<unsigned long long>(n_changed));
    if (n_guided_eq) atomicAdd(counters + 2, static_cast<unsigned long long>(n_guided_eq));
    if (n_nearest_eq) atomicAdd(counters + 3, static_cast<unsigned long long>(n_nearest_eq));
  }
}

template <class Cfg>
__device__ __forceinline__ void guided_fake_quantize_rows(
    const typename Cfg::T* __restrict__ x,     // [rows, D]
    const float* __restrict__ row_scales,      // [rows]
    const uint8_t* __restrict__ block_scales,  // [rows, D/16] e4m3
    const uint8_t* __restrict__ mantissa_bits, // [rows, D/8] (compact) or null
    const uint8_t* __restrict__ rollout_codes, // [rows, D/2] (full) or null
    typename Cfg::T* __restrict__ out,         // [rows, D]
    unsigned long long* __restrict__ counters, // [4] or null
    int rows, uint32_t* __restrict__ status) {
  using T = typename Cfg::T;
  const int64_t total = static_cast<int64_t>(rows) * Cfg::kHalfBlocksPerRow;  // half blocks
  const int64_t first = static_cast<int64_t>(blockIdx.x) * Cfg::CTA * Cfg::kSlots + threadIdx.x;
  const bool full = rollout_codes != nullptr;

  Vec8<T> v[Cfg::kSlots];
  uint32_t guide[Cfg::kSlots];  // 8 mantissa bits or 8 rollout codes
  float d[Cfg::kSlots];
#pragma unroll
  for (int k = 0; k < Cfg::kSlots; ++k) {  // issue every load before the first use
    const int64_t g = first + static_cast<int64_t>(k) * Cfg::CTA;
    if (g < total) {
      const int64_t row = g / Cfg::kHalfBlocksPerRow;
      v[k].load_stream(x + g * 8);
      guide[k] = full ? __ldg(reinterpret_cast<const uint32_t*>(rollout_codes) + g) : __ldg(mantissa_bits + g);
      const float b = nvfp4::e4m3_to_float(__ldg(block_scales + g / 2));
      d[k] = b * __ldg(row_scales + row);
    } else {
      v[k].zero();
      guide[k] = 0u;
      d[k] = 0.f;
    }
  }

  uint32_t n_elems = 0, n_changed = 0, n_guided_eq = 0, n_nearest_eq = 0;
#pragma unroll
  for (int k = 0; k < Cfg::kSlots; ++k) {
    const int64_t g = first + static_cast<int64_t>(k) * Cfg::CTA;
    if (g >= total) continue;
    float f[8];
    v[k].to_float(f);
    float amax = fabsf(f[0]);
#pragma unroll
    for (int j = 1; j < 8; ++j) amax = nvfp4::fmax_nan(amax, fabsf(f[j]));
    if (!nvfp4::is_finite(amax)) {
      report_nonfinite_half_block<Cfg>(status, g, f);
      continue;  // leave these 8 outputs unwritten; the status flag says why
    }
    n_elems += 8;
    float y8[8];
    if (d[k] == 0.f) {  // the rollout's codes are +0 (full guidance says so too) and so are ours
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        y8[j] = 0.f;
        if (full) {
          const bool zero = (guide[k] >> (4 * j) & 7u) == 0u;
          n_guided_eq += zero;
          n_nearest_eq += zero;
        }
      }
    } else {
      const nvfp4::Divisor div = nvfp4::make_divisor(d[k]);
      bool fast = div.ok;  // one branch per half block, not per element
#pragma unroll
      for (int j = 0; j < 8; ++j) fast = fast && nvfp4::fast_divisible(f[j]);
      float q[8];
      if (fast) {
#pragma unroll
        for (int j = 0; j < 8; ++j) q[j] = nvfp4::div_rn_fast(f[j], div);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) q[j] = __fdiv_rn(f[j], div.d);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float y = q[j];
        const bool neg = y < 0.f;
        const nvfp4::GridPos p = nvfp4::grid_position(fminf(fabsf(y), nvfp4::kFp4Max));
        uint32_t m;  // chosen magnitude index; its sign is y's
        if (full) {
          const uint32_t code = (guide[k] >> (4 * j)) & 0xFu;
          const int rollout = nvfp4::signed_index(code);
          // lower signed neighbour lo_k; take it iff the rollout's index is <= lo_k
          const int lo_k = neg ? -static_cast<int>(p.lo) - 1 : static_cast<int>(p.lo);
          const bool take_lower = rollout <= lo_k;
          m = p.on_grid ? p.lo : (neg != take_lower ? p.lo : p.lo + 1u);
          const int chosen = neg ? -static_cast<int>(m) : static_cast<int>(m);
          const int nearest = neg ? -static_cast<int>(p.nearest) : static_cast<int>(p.nearest);
          n_guided_eq += chosen == rollout;
          n_nearest_eq += nearest == rollout;
        } else {
          const uint32_t bit = (guide[k] >> j) & 1u;
          m = p.on_grid ? p.lo : p.lo + ((p.lo ^ bit) & 1u);
        }
        n_changed += m != p.nearest;  // same sign, so magnitudes decide
        // value(m) * d with y's sign (a chosen zero is +0, as in the reference)
        const uint32_t sign = (neg && m != 0u) ? 0x80000000u : 0u;
        y8[j] = __uint_as_float(nvfp4::e2m1_value_bits(m) | sign) * d[k];
      }
    }
    store8<T>(out + g * 8, y8);
  }

  if (counters != nullptr) flush_counters(counters, n_elems, n_changed, n_guided_eq, n_nearest_eq);
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
// shifted domain: value(code) + offset is exact). Counters as in v1: changed, chosen == rollout,
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

template <class Cfg>
__device__ __forceinline__ void guided_fake_quantize_rows_v2(
    const typename Cfg::T* __restrict__ x, const float* __restrict__ row_scales,
    const uint8_t* __restrict__ block_scales, const uint8_t* __restrict__ mantissa_bits,
    const uint8_t* __restrict__ rollout_codes, typename Cfg::T* __restrict__ out,
    unsigned long long* __restrict__ counters, int rows, uint32_t* __restrict__ status) {
  using T = typename Cfg::T;
  const int64_t total = static_cast<int64_t>(rows) * Cfg::kHalfBlocksPerRow;  // half blocks
  const int64_t first = static_cast<int64_t>(blockIdx.x) * Cfg::CTA * Cfg::kSlots + threadIdx.x;
  const bool full = rollout_codes != nullptr;
  const bool count = counters != nullptr;

  Vec8<T> v[Cfg::kSlots];
  uint32_t guide[Cfg::kSlots];  // 8 mantissa bits or 8 rollout codes
  float d[Cfg::kSlots];
#pragma unroll
  for (int k = 0; k < Cfg::kSlots; ++k) {  // issue every load before the first use
    const int64_t g = first + static_cast<int64_t>(k) * Cfg::CTA;
    if (g < total) {
      const int64_t row = g / Cfg::kHalfBlocksPerRow;
      v[k].load_stream(x + g * 8);
      guide[k] = full ? __ldg(reinterpret_cast<const uint32_t*>(rollout_codes) + g) : __ldg(mantissa_bits + g);
      const float b = nvfp4::e4m3_to_float(__ldg(block_scales + g / 2));
      d[k] = b * __ldg(row_scales + row);
    } else {
      v[k].zero();
      guide[k] = 0u;
      d[k] = 0.f;
    }
  }

  uint32_t n_elems = 0, n_changed = 0, n_guided_eq = 0, n_nearest_eq = 0;
#pragma unroll
  for (int k = 0; k < Cfg::kSlots; ++k) {
    const int64_t g = first + static_cast<int64_t>(k) * Cfg::CTA;
    if (g >= total) continue;
    float f[8];
    v[k].to_float(f);
    // amax (NaN wins) and the smallest nonzero |x| as bits: 2 |x|bits - 2 wraps 0 to the top
    float amax = fabsf(f[0]);
    uint32_t min_nonzero2 = (__float_as_uint(f[0]) << 1) - 2u;
#pragma unroll
    for (int j = 1; j < 8; ++j) {
      amax = nvfp4::fmax_nan(amax, fabsf(f[j]));
      min_nonzero2 = min(min_nonzero2, (__float_as_uint(f[j]) << 1) - 2u);
    }
    if (!nvfp4::is_finite(amax)) {
      report_nonfinite_half_block<Cfg>(status, g, f);
      continue;  // leave these 8 outputs unwritten; the status flag says why
    }
    n_elems += 8;
    float y8[8];
    if (d[k] == 0.f) {  // the rollout's codes are +0 (full guidance says so too) and so are ours
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        y8[j] = 0.f;
        if (full && count) {
          const bool zero = (guide[k] >> (4 * j) & 7u) == 0u;
          n_guided_eq += zero;
          n_nearest_eq += zero;
        }
      }
    } else {
      const nvfp4::Divisor div = nvfp4::make_divisor(d[k]);
      // nvfp4::fast_divisible for all 8 at once: every nonzero |x| in [2^-80, 2^80]
      const bool fast = div.ok && amax <= 0x1p80f && min_nonzero2 >= (0x17800000u << 1) - 2u;
      float q[8];
      if (fast) {
#pragma unroll
        for (int j = 0; j < 8; ++j) q[j] = nvfp4::div_rn_fast(f[j], div);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) q[j] = __fdiv_rn(f[j], div.d);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t uq = __float_as_uint(q[j]);
        const uint32_t y_sign = uq & 0x80000000u;
        const uint32_t ua = __float_as_uint(fminf(fabsf(q[j]), nvfp4::kFp4Max));
        uint32_t chosen;
        if (full) {
          chosen = guided_full_bits(__uint_as_float(ua), y_sign, (guide[k] >> (4 * j)) & 0xFu, count, n_changed,
                                    n_guided_eq, n_nearest_eq);
        } else {
          chosen = guided_compact_bits(__uint_as_float(ua), guide[k] << (22 - j), count, n_changed);
        }
        // value(chosen) * d with y's sign; + 0 turns a chosen -0 into +0, as in the reference
        y8[j] = fmaf(__uint_as_float(chosen | y_sign), d[k], 0.f);
      }
    }
    store8<T>(out + g * 8, y8);
  }

  if (count) flush_counters(counters, n_elems, n_changed, n_guided_eq, n_nearest_eq);
}

template <class Cfg>
__device__ __forceinline__ void guided_fake_quantize_kernel(
    const typename Cfg::T* __restrict__ x, const float* __restrict__ row_scales,
    const uint8_t* __restrict__ block_scales, const uint8_t* __restrict__ mantissa_bits,
    const uint8_t* __restrict__ rollout_codes, typename Cfg::T* __restrict__ out,
    unsigned long long* __restrict__ counters, int rows, uint32_t* __restrict__ status) {
  if constexpr (Cfg::kVariant == 2)
    guided_fake_quantize_rows_v2<Cfg>(x, row_scales, block_scales, mantissa_bits, rollout_codes, out, counters, rows,
                                      status);
  else
    guided_fake_quantize_rows<Cfg>(x, row_scales, block_scales, mantissa_bits, rollout_codes, out, counters, rows,
                                   status);
}

}  // namespace trace_kernels
