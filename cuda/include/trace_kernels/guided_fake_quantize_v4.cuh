// Guided fake quantization's loop (see guided_fake_quantize.cuh for the op and the block arithmetic): v3's per-block
// arithmetic in a software-pipelined persistent loop (v4). A plain loop issues a pass's loads and then waits for
// them, so each warp has bytes in flight only while it is stalled; this one issues the next pass's loads (x,
// guidance, scale bytes) into a second register set before it computes the current pass, so a warp's compute and
// stores overlap its next loads (2x the bytes in flight per thread, at the cost of the second register set: one
// pass = KSLOTS blocks of 32 B of 16-bit input plus guidance). Results and counters are those of the plain loop
// (guided_fake_quantize_rows_v3), bit for bit. FP16 input runs the plain loop (see guided_fake_quantize_kernel_v4).
// The kernels: guided_fake_quantize_v5.cuh (the trainer's call) and guided_fake_quantize_v7.cuh (the audit calls).
#pragma once

#include "trace_kernels/guided_fake_quantize.cuh"

namespace trace_kernels {

template <typename T_, int D_, int CTA_, int KSLOTS_>
struct GuidedConfigV4 {
  using T = T_;
  static constexpr int D = D_;
  static constexpr int CTA = CTA_;
  static constexpr int kSlots = KSLOTS_;  // whole blocks per thread and pass
  static constexpr int kHalfBlocksPerRow = D / 8;
  static constexpr int kBlocksPerRow = D / nvfp4::kBlock;
  static_assert(D % nvfp4::kBlock == 0, "D must be a multiple of 16");
  static_assert(CTA % 32 == 0, "whole warps");
};

// One pass's loads, raw: the block scale stays a byte until the pass is computed (fewer registers
// than the FP32 step while the loads are in flight).
template <class Cfg>
struct GuidedPassV4 {
  Vec8<typename Cfg::T> v[Cfg::kSlots][2];
  uint2 guide[Cfg::kSlots];  // compact: 16 bits in .x; full: 16 codes
  uint32_t scale_byte[Cfg::kSlots];
  float row_scale[Cfg::kSlots];
};

template <class Cfg, bool kFull>
__device__ __forceinline__ void guided_load_pass_v4(GuidedPassV4<Cfg>& p, int64_t first, int64_t total,
                                                    const typename Cfg::T* __restrict__ x,
                                                    const float* __restrict__ row_scales,
                                                    const uint8_t* __restrict__ block_scales,
                                                    const uint8_t* __restrict__ mantissa_bits,
                                                    const uint8_t* __restrict__ rollout_codes) {
#pragma unroll
  for (int k = 0; k < Cfg::kSlots; ++k) {
    const int64_t blk = first + static_cast<int64_t>(k) * Cfg::CTA;
    if (blk < total) {
      p.v[k][0].load_stream(x + blk * 16);
      p.v[k][1].load_stream(x + blk * 16 + 8);
      if (kFull) p.guide[k] = __ldg(reinterpret_cast<const uint2*>(rollout_codes) + blk);
      else p.guide[k] = make_uint2(__ldg(mantissa_bits + 2 * blk) | __ldg(mantissa_bits + 2 * blk + 1) << 8, 0u);
      p.scale_byte[k] = __ldg(block_scales + blk);
      p.row_scale[k] = __ldg(row_scales + blk / Cfg::kBlocksPerRow);
    }
  }
}

// One pass from registers: v3's block function per slot, the exact per-element path for the rare
// blocks it declines (reloaded from memory), the packed counters folded.
template <class Cfg, bool kFull>
__device__ __forceinline__ void guided_compute_pass_v4(
    const GuidedPassV4<Cfg>& p, int64_t first, int64_t total, bool count, const typename Cfg::T* __restrict__ x,
    const float* __restrict__ row_scales, const uint8_t* __restrict__ block_scales,
    const uint8_t* __restrict__ mantissa_bits, const uint8_t* __restrict__ rollout_codes,
    typename Cfg::T* __restrict__ out, uint32_t* __restrict__ status, uint32_t& n_elems, uint32_t& n_changed,
    uint32_t& n_guided_eq, uint32_t& n_nearest_eq) {
  GuidedCountsV3 packed;
  uint32_t slow = 0;  // slots left to the exact per-element path (rare: reloaded below)
#pragma unroll
  for (int k = 0; k < Cfg::kSlots; ++k) {
    const int64_t blk = first + static_cast<int64_t>(k) * Cfg::CTA;
    if (blk < total) {
      const float d = nvfp4::e4m3_to_float(static_cast<uint8_t>(p.scale_byte[k])) * p.row_scale[k];
      if (guided_block_v3<Cfg, kFull>(p.v[k], p.guide[k], d, count, blk, out, packed)) n_elems += 16;
      else slow |= 1u << k;
    }
  }
  guided_pass_tail<Cfg, kFull>(slow, packed, first, count, x, row_scales, block_scales, mantissa_bits, rollout_codes,
                               out, status, n_elems, n_changed, n_guided_eq, n_nearest_eq);
}

template <class Cfg, bool kFull>
__device__ __forceinline__ void guided_fake_quantize_rows_v4(
    const typename Cfg::T* __restrict__ x, const float* __restrict__ row_scales,
    const uint8_t* __restrict__ block_scales, const uint8_t* __restrict__ mantissa_bits,
    const uint8_t* __restrict__ rollout_codes, typename Cfg::T* __restrict__ out,
    unsigned long long* __restrict__ counters, int rows, uint32_t* __restrict__ status) {
  const int64_t total = static_cast<int64_t>(rows) * Cfg::kBlocksPerRow;  // blocks
  const int64_t stride = static_cast<int64_t>(gridDim.x) * Cfg::CTA * Cfg::kSlots;
  const bool count = counters != nullptr;
  uint32_t n_elems = 0, n_changed = 0, n_guided_eq = 0, n_nearest_eq = 0;

  // two register sets in turn (the loop body is unrolled twice, so no set is copied): the next
  // pass's loads go into one while the pass in the other is computed
  int64_t first = static_cast<int64_t>(blockIdx.x) * Cfg::CTA * Cfg::kSlots + threadIdx.x;
  GuidedPassV4<Cfg> even, odd;
  guided_load_pass_v4<Cfg, kFull>(even, first, total, x, row_scales, block_scales, mantissa_bits, rollout_codes);
  while (first < total) {
    guided_load_pass_v4<Cfg, kFull>(odd, first + stride, total, x, row_scales, block_scales, mantissa_bits,
                                    rollout_codes);
    guided_compute_pass_v4<Cfg, kFull>(even, first, total, count, x, row_scales, block_scales, mantissa_bits,
                                       rollout_codes, out, status, n_elems, n_changed, n_guided_eq, n_nearest_eq);
    first += stride;
    if (first >= total) break;
    guided_load_pass_v4<Cfg, kFull>(even, first + stride, total, x, row_scales, block_scales, mantissa_bits,
                                    rollout_codes);
    guided_compute_pass_v4<Cfg, kFull>(odd, first, total, count, x, row_scales, block_scales, mantissa_bits,
                                       rollout_codes, out, status, n_elems, n_changed, n_guided_eq, n_nearest_eq);
    first += stride;
  }
  if (count) {
    const uint32_t n[4] = {n_elems, n_changed, n_guided_eq, n_nearest_eq};
    flush_counters_cta<Cfg::CTA>(counters, n);
  }
}

template <class Cfg>
__device__ __forceinline__ void guided_fake_quantize_kernel_v4(
    const typename Cfg::T* __restrict__ x, const float* __restrict__ row_scales,
    const uint8_t* __restrict__ block_scales, const uint8_t* __restrict__ mantissa_bits,
    const uint8_t* __restrict__ rollout_codes, typename Cfg::T* __restrict__ out,
    unsigned long long* __restrict__ counters, int rows, uint32_t* __restrict__ status) {
  if constexpr (std::is_same<typename Cfg::T, __half>::value) {
    // FP16's 14 thresholds are computed one by one (no exponent shortcut): with a second register
    // set that spills at 128 registers, so FP16 keeps v3's loop (same results)
    if (rollout_codes != nullptr)
      guided_fake_quantize_rows_v3<Cfg, true>(x, row_scales, block_scales, mantissa_bits, rollout_codes, out, counters,
                                              rows, status);
    else
      guided_fake_quantize_rows_v3<Cfg, false>(x, row_scales, block_scales, mantissa_bits, rollout_codes, out,
                                               counters, rows, status);
  } else if (rollout_codes != nullptr)
    guided_fake_quantize_rows_v4<Cfg, true>(x, row_scales, block_scales, mantissa_bits, rollout_codes, out, counters,
                                            rows, status);
  else
    guided_fake_quantize_rows_v4<Cfg, false>(x, row_scales, block_scales, mantissa_bits, rollout_codes, out, counters,
                                             rows, status);
}

}  // namespace trace_kernels
