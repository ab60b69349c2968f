// The refit_weights kernel body the template instantiates: the config's variant picks the implementation
// (refit_weights.cuh: v2, refit_weights_speculative.cuh: v8 and v9). plan_b is the phase of the launch (v2 and v8:
// 0, 1; v9: 0, 1, 2); plan_a is unused.
#pragma once

#include "trace_kernels/refit_weights.cuh"
#include "trace_kernels/refit_weights_speculative.cuh"

namespace trace_kernels {

template <class Cfg>
__device__ __forceinline__ void refit_weights_kernel(const typename Cfg::T* __restrict__ w, uint8_t* __restrict__ codes,
                                                     uint8_t* __restrict__ block_scales, float* __restrict__ scales,
                                                     uint32_t* __restrict__ workspace, int experts, int64_t per_expert,
                                                     int k_dim, int plan_a, int plan_b, uint32_t* __restrict__ status) {
  if constexpr (Cfg::kVariant == 9) {
    if (plan_b == 0) refit_speculate<Cfg>(w, codes, block_scales, scales, workspace + 2 * experts, experts, per_expert);
    else if (plan_b == 1) refit_verdict_v9<Cfg>(workspace, experts, per_expert);
    else refit_requantize_v9<Cfg>(w, codes, block_scales, scales, workspace, experts, per_expert, k_dim, status);
  } else if constexpr (Cfg::kVariant == 8) {
    if (plan_b == 0) refit_speculate<Cfg>(w, codes, block_scales, scales, workspace, experts, per_expert);
    else refit_settle_v8<Cfg>(w, codes, block_scales, scales, workspace, experts, per_expert, k_dim, status);
  } else {
    if (plan_b == 0) refit_amax_v2<Cfg>(w, workspace, per_expert);
    else refit_quantize_v2<Cfg>(w, codes, block_scales, scales, workspace, experts, per_expert, k_dim, status);
  }
}

}  // namespace trace_kernels
