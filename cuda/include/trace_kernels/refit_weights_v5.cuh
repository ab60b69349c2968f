// refit_weights v5 (see refit_weights.cuh for the op and v1..v4): one ordinary launch whose CTAs
// take work items from a global counter in a fixed order that overlaps streaming with quantizing:
//   A(0), A(1), Q(0), A(2), Q(1), ..., A(K-1), Q(K-2), Q(K-1)
// where chunk c is `chunk_experts` consecutive experts (K chunks), A(c) its tiles' amax items (one
// DRAM read, lines kept in L2 with evict_last) and Q(c) its tiles' quantize items (re-read from L2,
// evict_first). While some SMs stream chunk c + 1 from DRAM, others quantize chunk c: the DRAM and
// the rounding arithmetic work at the same time, and w is read from DRAM once when two chunks and
// their outputs fit in L2 (the host sizes chunks at ~L2 / 4).
// A Q item waits until every A item of its expert is done (a per-expert count, release/acquire).
// Those A items precede it in the claim order and are claimed only by running CTAs: no co-residency
// is needed and no wait can deadlock. A wait longer than ~2 s traps (a launch error, not a hang).
// workspace (zeroed by the host): [2 e] amax bits of expert e, [2 e + 1] its A tiles done,
// [2 E] the item counter.
#pragma once

#include <cuda/atomic>

#include "trace_kernels/refit_weights.cuh"

namespace trace_kernels {

struct RefitItemV5 {
  bool quantize;  // Q item, else A item
  int expert;
  int64_t tile;   // tile index inside the expert
};

// Item i of the sequence above (-1 expert: past the end). chunks have chunk_experts experts except
// possibly the last; K is small (experts / chunk_experts), so a walk over the phases is cheap.
__device__ __forceinline__ RefitItemV5 refit_item_v5(int64_t i, int experts, int chunk_experts,
                                                     int64_t tiles_per_expert) {
  const int chunks = (experts + chunk_experts - 1) / chunk_experts;
  auto chunk_tiles = [&](int c) {
    return static_cast<int64_t>(min(chunk_experts, experts - c * chunk_experts)) * tiles_per_expert;
  };
  for (int p = 0; p <= chunks; ++p) {  // phase p: A(p) (p < chunks), then Q(p - 1) (p >= 1)
    const int64_t a = p < chunks ? chunk_tiles(p) : 0;
    if (i < a) return {false, p * chunk_experts + static_cast<int>(i / tiles_per_expert), i % tiles_per_expert};
    i -= a;
    const int64_t q = p >= 1 ? chunk_tiles(p - 1) : 0;
    if (i < q) return {true, (p - 1) * chunk_experts + static_cast<int>(i / tiles_per_expert), i % tiles_per_expert};
    i -= q;
  }
  return {false, -1, 0};
}

template <class Cfg>
__device__ __forceinline__ void refit_work_queue_v5(const typename Cfg::T* __restrict__ w, uint8_t* __restrict__ codes,
                                                    uint8_t* __restrict__ block_scales, float* __restrict__ scales,
                                                    uint32_t* __restrict__ workspace, int experts,
                                                    int64_t per_expert, int k_dim, int chunk_experts,
                                                    uint32_t* __restrict__ status) {
  __shared__ float warp_amax[Cfg::CTA / 32];
  __shared__ RefitItemV5 item_shared;
  __shared__ float expert_amax_shared;
  const int64_t tiles_per_expert = (per_expert / 8 + Cfg::kTileHalfBlocks - 1) / Cfg::kTileHalfBlocks;
  const uint64_t keep = l2_policy_evict_last(), last_use = l2_policy_evict_first();
  Vec8<typename Cfg::T> v[Cfg::kSlots];

  // Thread 0 claims the next item while this one runs (its atomic's latency hidden). Progress: the
  // first unfinished item in claim order is being run, not held (its holder runs an earlier one),
  // and everything it waits for comes earlier in the order.
  uint32_t next = threadIdx.x == 0 ? atomicAdd(workspace + 2 * experts, 1u) : 0u;
  while (true) {
    if (threadIdx.x == 0) item_shared = refit_item_v5(next, experts, chunk_experts, tiles_per_expert);
    __syncthreads();
    const RefitItemV5 item = item_shared;
    if (item.expert < 0) return;
    if (threadIdx.x == 0) next = atomicAdd(workspace + 2 * experts, 1u);
    const int e = item.expert;
    if (!item.quantize) {  // amax of one tile, counted on its expert
      load_tile<Cfg, true>(w + static_cast<int64_t>(e) * per_expert, item.tile, per_expert / 8, v, keep);
      float amax = 0.f;
#pragma unroll
      for (int k = 0; k < Cfg::kSlots; ++k) amax = nvfp4::fmax_nan(amax, v[k].abs_max());
      amax = cta_amax<Cfg>(amax, warp_amax);
      if (threadIdx.x == 0) publish_expert_amax(workspace, e, amax);
    } else {  // quantize one tile once its expert's amax is complete
      if (threadIdx.x == 0) {
        wait_for_arrivals(workspace[2 * e + 1], static_cast<uint32_t>(tiles_per_expert));
        expert_amax_shared = expert_amax_of(workspace, e);
      }
      __syncthreads();
      refit_quantize_tile<Cfg, true>(w, codes, block_scales, scales, expert_amax_shared, e, item.tile, per_expert,
                                     k_dim, status, last_use);
    }
    __syncthreads();  // item_shared, warp_amax and expert_amax_shared are rewritten by the next item
  }
}

}  // namespace trace_kernels
