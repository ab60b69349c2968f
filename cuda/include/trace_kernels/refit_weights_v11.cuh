// refit v11: v8's two launches with v9's shared-out requantize, and verdicts that need no reduction.
//
// v9 is robust when a quarter of the experts moved (one wave shares out their tiles) but pays for a verdict launch
// between phase 0 and that wave; v8 has no verdict launch but settles each expert with its own few CTAs. v11:
// phase 0 (v8's, grid (tiles, E)): besides its warp words, lane 0 of each warp marks its expert with this call's epoch
//   when the warp's own scale RN(amax_w / 2688) equals the guess ("confirmed") or exceeds it / is not finite
//   ("disproved"). The expert scale is the largest warp scale (the scale is monotone in the amax), so the guess held
//   exactly when the guess is valid, some warp confirmed it and none disproved it: two words per expert instead of a
//   reduction over its 1536 warp words. Marks are rare stores: in a steady step only the warps holding an expert's
//   largest |w| confirm, and none disproves.
// phase 1 (one wave, a programmatic dependent launch): v9's requantize wave, reading the marks 32 experts per warp
//   load; a CTA reduces a failed expert's warp words itself when it takes one of its tiles. The last CTA to leave
//   advances the epoch.
// Counters (int32 [8 + 2 E] per destination, zeroed once by the host): the epoch, the CTAs that left phase 1, then the
// confirm and disprove marks. The epoch lives on the device, so a replayed CUDA graph moves it on too: a mark left by
// an earlier call never matches.
// Measured on the H200 (memory_refit_v11_h200.json): bit-exact, and slower than v8 on steady weights (67% / 81% / 88% of
// copy at 64 MB / 256 MB / 1 GB against 76% / 87% / 92%) and than v9 on mixed ones (52% / 56% / 61% against 59% / 61% /
// 65%): an A/B variant.
#pragma once

#include <cuda/atomic>

#include "trace_kernels/pdl.cuh"
#include "trace_kernels/refit_weights_v8.cuh"

namespace trace_kernels {

namespace refit_v11 {
constexpr int kEpoch = 0;   // the previous call's epoch (this call's is one more)
constexpr int kExited = 1;  // phase-1 CTAs that have left
constexpr int kHeader = 8;
using Counter = cuda::atomic_ref<uint32_t, cuda::thread_scope_device>;
}  // namespace refit_v11

// Whether expert e's guess failed in the call of this epoch (words: v8's, guesses first; marks: confirm, disprove).
__device__ __forceinline__ bool refit_v11_failed(const uint32_t* __restrict__ words, const uint32_t* __restrict__ marks,
                                                 int experts, int e, uint32_t epoch) {
  return !(refit_v7_guess_valid(__uint_as_float(__ldcg(words + e))) && __ldcg(marks + e) == epoch &&
           __ldcg(marks + experts + e) != epoch);
}

template <class Cfg>
__device__ __forceinline__ void refit_speculate_v11(const typename Cfg::T* __restrict__ w, uint8_t* __restrict__ codes,
                                                    uint8_t* __restrict__ block_scales,
                                                    const float* __restrict__ scales, uint32_t* __restrict__ words,
                                                    uint32_t* __restrict__ counters, int experts, int64_t per_expert,
                                                    int k_dim, uint32_t* __restrict__ status) {
  pdl::allow_dependent_launch();  // phase 1 may become resident once every tile has started; it waits for them all
  const uint32_t epoch = __ldcg(counters + refit_v11::kEpoch) + 1u;
  refit_speculate_tile<Cfg, true, true>(w, codes, block_scales, scales, words, experts, per_expert, k_dim, blockIdx.y,
                                        blockIdx.x, status, counters + refit_v11::kHeader, epoch);
}

template <class Cfg>
__device__ __forceinline__ void refit_requantize_v11(const typename Cfg::T* __restrict__ w,
                                                     uint8_t* __restrict__ codes, uint8_t* __restrict__ block_scales,
                                                     float* __restrict__ scales, const uint32_t* __restrict__ words,
                                                     uint32_t* __restrict__ counters, int experts, int64_t per_expert,
                                                     int k_dim, uint32_t* __restrict__ status) {
  __shared__ float warp_amax[Cfg::CTA / 32];
  pdl::wait_for_prerequisite_grid();  // phase 0's words and marks
  const uint32_t epoch = __ldcg(counters + refit_v11::kEpoch) + 1u;
  const uint32_t* marks = counters + refit_v11::kHeader;
  const int64_t tiles = refit_tiles_per_expert<Cfg>(per_expert);
  const int64_t total = experts * tiles, stride = gridDim.x;
  const auto failed = [words, marks, experts, epoch](int x) { return refit_v11_failed(words, marks, experts, x, epoch); };
  const auto next = [&](int64_t g) { return refit_next_failed_tile(failed, g, experts, tiles, stride); };
  int amax_of = -1;
  float expert_amax = 0.f;
  for (int64_t g = next(blockIdx.x); g < total; g = next(g + stride)) {
    const int e = experts - 1 - static_cast<int>(g / tiles);
    if (e != amax_of) {
      __syncthreads();  // warp_amax is rewritten
      expert_amax = refit_v8_expert_amax<Cfg>(words, experts, e, per_expert, warp_amax);
      amax_of = e;
    }
    refit_requantize_tile<Cfg>(w, codes, block_scales, scales, expert_amax, e, g % tiles, per_expert, k_dim, status);
  }
  if (threadIdx.x == 0 &&
      refit_v11::Counter(counters[refit_v11::kExited]).fetch_add(1u, cuda::memory_order_acq_rel) == gridDim.x - 1) {
    counters[refit_v11::kEpoch] = epoch;  // every CTA has read the epoch before it counted itself out
    counters[refit_v11::kExited] = 0u;
  }
}

}  // namespace trace_kernels
