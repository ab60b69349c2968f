// Guided fake quantization v5 (see guided_fake_quantize.cuh for the op and v1..v3): v4's
// software-pipelined loop, compiled once per guidance mode instead of once for all of them.
// v4 branches at run time between compact and full guidance, with and without counters, so
// ptxas gives every launch the registers of its most demanding mode (127 with full guidance and
// counters): 16 warps per SM for the trainer's compact call too, which alone needs ~77. v5 makes
// the mode a template parameter (one kernel per mode), and each mode's kernel asks for the CTAs
// per SM its registers allow (codegen: V5_CTAS_PER_SM). Results and counters are v4's bit for bit
// (same block function, same exact fallback); FP16 input runs v3's loop, as in v4.
#pragma once

#include "trace_kernels/guided_fake_quantize_v4.cuh"

namespace trace_kernels {

template <typename T_, int D_, int CTA_, int KSLOTS_, bool FULL_, bool COUNT_>
struct GuidedConfigV5 : GuidedConfigV4<T_, D_, CTA_, KSLOTS_> {
  static constexpr bool kFull = FULL_;    // rollout codes (full guidance) instead of mantissa bits
  static constexpr bool kCount = COUNT_;  // audit counters
};

// The launcher passes rollout codes exactly when Cfg::kFull and counters exactly when Cfg::kCount.
template <class Cfg>
__device__ __forceinline__ void guided_fake_quantize_kernel_v5(
    const typename Cfg::T* __restrict__ x, const float* __restrict__ row_scales,
    const uint8_t* __restrict__ block_scales, const uint8_t* __restrict__ mantissa_bits,
    const uint8_t* __restrict__ rollout_codes, typename Cfg::T* __restrict__ out,
    unsigned long long* __restrict__ counters, int rows, uint32_t* __restrict__ status) {
  // a null pointer folds the counting away; a non-null one makes `count` a constant true
  unsigned long long* const counts = Cfg::kCount ? counters : nullptr;
  if constexpr (std::is_same<typename Cfg::T, __half>::value)
    guided_fake_quantize_rows_v3<Cfg, Cfg::kFull>(x, row_scales, block_scales, mantissa_bits, rollout_codes, out,
                                                  counts, rows, status);
  else
    guided_fake_quantize_rows_v4<Cfg, Cfg::kFull>(x, row_scales, block_scales, mantissa_bits, rollout_codes, out,
                                                  counts, rows, status);
}

}  // namespace trace_kernels
