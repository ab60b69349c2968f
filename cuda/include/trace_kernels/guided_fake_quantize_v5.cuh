// Guided fake quantization v5 and v6 (see guided_fake_quantize.cuh for the op and v1..v3): the
// trainer's call (compact guidance, no counters) in a kernel of its own.
// v4 branches at run time between compact and full guidance, with and without counters, so ptxas
// gives every launch the registers of its most demanding mode (127, full guidance with counters):
// 16 warps per SM for the compact call too. Compiled for that call alone, v4's loop needs 77, and
// the kernel asks for 3 CTAs of 256 threads per SM (24 warps; codegen COMPACT_ONLY_CTAS_PER_SM).
// v5: v4's loop and block function (v3's search). v6: the same with v3's third search level and
// output tree replaced by prmt table lookups (guided_pair_tables). Results are v3's bit for bit; FP16
// input runs v3's loop, as in v4. The other modes launch v4's kernel (codegen).
#pragma once

#include "trace_kernels/guided_fake_quantize_v4.cuh"

namespace trace_kernels {

template <typename T_, int D_, int CTA_, int KSLOTS_, bool TABLES_>
struct GuidedConfigV5 : GuidedConfigV4<T_, D_, CTA_, KSLOTS_> {
  static constexpr bool kTables = TABLES_;  // v6
};

// Compact guidance, no counters: rollout codes and counters are not read.
template <class Cfg>
__device__ __forceinline__ void guided_fake_quantize_kernel_v5(
    const typename Cfg::T* __restrict__ x, const float* __restrict__ row_scales,
    const uint8_t* __restrict__ block_scales, const uint8_t* __restrict__ mantissa_bits,
    typename Cfg::T* __restrict__ out, int rows, uint32_t* __restrict__ status) {
  guided_fake_quantize_kernel_v4<Cfg>(x, row_scales, block_scales, mantissa_bits, nullptr, out, nullptr, rows, status);
}

}  // namespace trace_kernels
