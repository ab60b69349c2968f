// Guided fake quantization, the trainer's call (compact guidance, no counters) in a kernel of its own (v6; see
// guided_fake_quantize.cuh for the op). v4's loop branches at run time between compact and full guidance, with and
// without counters, so ptxas would give every launch the registers of its most demanding mode (127, full guidance
// with counters): 16 warps per SM. Compiled for this call alone it needs 77, and the kernel asks for 3 CTAs of 256
// threads per SM (24 warps; codegen COMPACT_ONLY_CTAS_PER_SM). The search's third level and output are prmt table
// lookups (guided_pair_tables). FP16 input runs the plain loop, as in v4. The audit calls have kernels of their own
// (guided_fake_quantize_v7.cuh).
#pragma once

#include "trace_kernels/guided_fake_quantize_v4.cuh"

namespace trace_kernels {

template <typename T_, int D_, int CTA_, int KSLOTS_>
struct GuidedConfigV5 : GuidedConfigV4<T_, D_, CTA_, KSLOTS_> {};

// Compact guidance, no counters: rollout codes and counters are not read.
template <class Cfg>
__device__ __forceinline__ void guided_fake_quantize_kernel_v5(
    const typename Cfg::T* __restrict__ x, const float* __restrict__ row_scales,
    const uint8_t* __restrict__ block_scales, const uint8_t* __restrict__ mantissa_bits,
    typename Cfg::T* __restrict__ out, int rows, uint32_t* __restrict__ status) {
  guided_fake_quantize_kernel_v4<Cfg>(x, row_scales, block_scales, mantissa_bits, nullptr, out, nullptr, rows, status);
}

}  // namespace trace_kernels
