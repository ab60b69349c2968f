// The refit_weights kernel body the template instantiates: the config's variant picks the
// implementation (refit_weights.cuh: v1..v3, refit_weights_v4.cuh: v4, refit_weights_v5.cuh: v5,
// refit_weights_v6.cuh: v6, refit_weights_v7.cuh: v7, refit_weights_v8.cuh: v8 and v9). The two int arguments are
// the variant's plan: v1 (ctas_per_group, unused), v2 (unused, phase), v3 (experts per chunk, unused), v4 (lag,
// stages), v5 (experts per chunk, unused), v6 (stages, lag), v7, v8 and v9 (unused, phase). v10 takes a second
// workspace and has an entry of its own (refit_weights_v10.cuh, the template's v10 branch).
#pragma once

#include "trace_kernels/refit_weights.cuh"
#include "trace_kernels/refit_weights_v4.cuh"
#include "trace_kernels/refit_weights_v5.cuh"
#include "trace_kernels/refit_weights_v6.cuh"
#include "trace_kernels/refit_weights_v7.cuh"
#include "trace_kernels/refit_weights_v8.cuh"

namespace trace_kernels {

template <class Cfg>
__device__ __forceinline__ void refit_weights_kernel(const typename Cfg::T* __restrict__ w, uint8_t* __restrict__ codes,
                                                     uint8_t* __restrict__ block_scales, float* __restrict__ scales,
                                                     uint32_t* __restrict__ workspace, int experts, int64_t per_expert,
                                                     int k_dim, int plan_a, int plan_b, uint32_t* __restrict__ status) {
  if constexpr (Cfg::kVariant == 9) {
    if (plan_b == 0)
      refit_speculate_v8<Cfg>(w, codes, block_scales, scales, workspace + 2 * experts, experts, per_expert, k_dim,
                              status);
    else if (plan_b == 1) refit_verdict_v9<Cfg>(workspace, experts, per_expert);
    else refit_requantize_v9<Cfg>(w, codes, block_scales, scales, workspace, experts, per_expert, k_dim, status);
  } else if constexpr (Cfg::kVariant == 8) {
    if (plan_b == 0)
      refit_speculate_v8<Cfg>(w, codes, block_scales, scales, workspace, experts, per_expert, k_dim, status);
    else refit_settle_v8<Cfg>(w, codes, block_scales, scales, workspace, experts, per_expert, k_dim, status);
  } else if constexpr (Cfg::kVariant == 7) {
    if (plan_b == 0)
      refit_speculate_v7<Cfg>(w, codes, block_scales, scales, workspace, experts, per_expert, k_dim, status);
    else refit_settle_v7<Cfg>(w, codes, block_scales, scales, workspace, experts, per_expert, k_dim, status);
  } else if constexpr (Cfg::kVariant == 6) {
    refit_warp_pipelined_v6<Cfg>(w, codes, block_scales, scales, workspace, experts, per_expert, k_dim, plan_a, plan_b,
                                 status);
  } else if constexpr (Cfg::kVariant == 5) {
    refit_work_queue_v5<Cfg>(w, codes, block_scales, scales, workspace, experts, per_expert, k_dim, plan_a, status);
  } else if constexpr (Cfg::kVariant == 4) {
    refit_smem_pipelined_v4<Cfg>(w, codes, block_scales, scales, workspace, experts, per_expert, k_dim, plan_a, plan_b,
                                 status);
  } else if constexpr (Cfg::kVariant == 2) {
    if (plan_b == 0) refit_amax_v2<Cfg>(w, workspace, per_expert);
    else refit_quantize_v2<Cfg>(w, codes, block_scales, scales, workspace, experts, per_expert, k_dim, status);
  } else if constexpr (Cfg::kVariant == 3) {
    refit_pipelined_v3<Cfg>(w, codes, block_scales, scales, workspace, experts, per_expert, k_dim, plan_a, status);
  } else {
    refit_weights<Cfg>(w, codes, block_scales, scales, workspace, experts, per_expert, k_dim, plan_a, status);
  }
}

}  // namespace trace_kernels
