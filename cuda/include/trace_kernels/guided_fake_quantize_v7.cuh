// Guided fake quantization v7 (see guided_fake_quantize.cuh for the op): the audit calls (compact guidance with
// counters, full guidance with and without), each in a kernel of its own. v4's one kernel branched on the mode at
// run time, so every call got the registers of the most demanding path (127: 2 CTAs of 256 per SM). v7 compiles one
// mode per kernel (FULL_, COUNT_ fixed) on v4's software-pipelined loop (or, PIPELINED_ false, the plain loop), with
// the table search (guided_pair_tables) and the counters' round-to-nearest parity on the FMA pipe
// (guided_count_pair). FP16 input runs the plain loop with the same block function, as in v4. The trainer's call
// (compact, no counters) launches v6's kernel (guided_fake_quantize_v5.cuh).
#pragma once

#include "trace_kernels/guided_fake_quantize_v4.cuh"

namespace trace_kernels {

template <typename T_, int D_, int CTA_, int KSLOTS_, bool FULL_, bool COUNT_, bool PIPELINED_ = true>
struct GuidedConfigV7 : GuidedConfigV4<T_, D_, CTA_, KSLOTS_> {
  static constexpr bool kFull = FULL_;    // rollout codes (else mantissa bits)
  static constexpr bool kCount = COUNT_;  // the launch passes counters (else they are not touched)
  // v4's software-pipelined loop (two register sets), else v3's (fewer registers, more warps; FP16: always v3's)
  static constexpr bool kPipelined = PIPELINED_;
};

template <class Cfg>
__device__ __forceinline__ void guided_fake_quantize_kernel_v7(
    const typename Cfg::T* __restrict__ x, const float* __restrict__ row_scales,
    const uint8_t* __restrict__ block_scales, const uint8_t* __restrict__ mantissa_bits,
    const uint8_t* __restrict__ rollout_codes, typename Cfg::T* __restrict__ out,
    unsigned long long* __restrict__ counters, int rows, uint32_t* __restrict__ status) {
  // null constants where the mode has none, so the compiler drops those paths (v4's dispatcher would keep
  // a run-time branch on rollout_codes, compiling both guidance paths into the full-guidance kernel)
  const uint8_t* bits = Cfg::kFull ? nullptr : mantissa_bits;
  const uint8_t* codes = Cfg::kFull ? rollout_codes : nullptr;
  unsigned long long* counts = Cfg::kCount ? counters : nullptr;
  if constexpr (std::is_same<typename Cfg::T, __half>::value || !Cfg::kPipelined)
    guided_fake_quantize_rows_v3<Cfg, Cfg::kFull>(x, row_scales, block_scales, bits, codes, out, counts, rows, status);
  else
    guided_fake_quantize_rows_v4<Cfg, Cfg::kFull>(x, row_scales, block_scales, bits, codes, out, counts, rows, status);
}

}  // namespace trace_kernels
