// refit v12: v9 without its verdict launch. v8's phase 0, then v9's requantize wave, whose warps give each expert's
// verdict themselves, the first warp to need it.
//
// v8 settles each expert with its own few CTAs (slow when a quarter of the experts moved); v9 settles them all in a
// launch of its own between phase 0 and the shared-out wave (one more launch, 1.5-6 us on steady weights). v11 tried
// per-expert marks with a device-side epoch and lost to both. v12 needs no epoch: the verdict words need resetting
// only between calls, and phase 0 runs between calls. So:
// phase 0 (v8's, grid (tiles, E)): tile 0 of expert e also resets e's verdict word to kUnknown. The wave waits for
//   phase 0 to complete, and the next call's phase 0 starts only after the wave has completed (an ordinary launch).
// phase 1 (one wave, a programmatic dependent launch): v9's walk over the failed experts' tiles, 32 verdicts per warp
//   load. A warp that finds an unknown verdict claims it (compare-and-swap to kClaimed), reduces the expert's warp
//   words from L2, stores the expert's amax and then, with release semantics, kHeld or kFailed. A warp that finds a
//   claimed verdict waits for it. The claimer is a running warp with no waits of its own before it settles its claim,
//   so every wait ends. Each warp claims at most one expert per look at its 32, so the first warps to arrive share the
//   experts out.
// Workspace: v9's, [0, 2 E) per expert its amax bits and verdict, then v8's (guesses, warp words).
#pragma once

#include "trace_kernels/refit_weights_v8.cuh"

namespace trace_kernels {

namespace refit_v12 {
constexpr uint32_t kUnknown = 0, kClaimed = 1, kHeld = 2, kFailed = 3;

__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void store_release(uint32_t* p, uint32_t v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
}  // namespace refit_v12

// Phase 0: v8's, and tile 0 of expert e resets e's verdict for this call's wave.
template <class Cfg>
__device__ __forceinline__ void refit_speculate_v12(const typename Cfg::T* __restrict__ w, uint8_t* __restrict__ codes,
                                                    uint8_t* __restrict__ block_scales,
                                                    const float* __restrict__ scales, uint32_t* __restrict__ workspace,
                                                    int experts, int64_t per_expert, int k_dim,
                                                    uint32_t* __restrict__ status) {
  if (blockIdx.x == 0 && threadIdx.x == 0) workspace[2 * blockIdx.y + 1] = refit_v12::kUnknown;
  refit_speculate_v8<Cfg>(w, codes, block_scales, scales, workspace + 2 * experts, experts, per_expert, k_dim, status);
}

// The warp settles expert x, which it has claimed: the max of x's warp words, x's amax bits, then its verdict. Not
// inlined: once per expert and call, and inlined into the wave's loop it made ptxas spill at 3 CTAs per SM.
template <class Cfg>
__device__ __noinline__ void refit_v12_settle(uint32_t* __restrict__ workspace, int experts, int64_t per_expert,
                                                 int x) {
  const uint32_t* speculation = workspace + 2 * experts;
  const int words = static_cast<int>(refit_v8_words_per_expert<Cfg>(per_expert));  // < 2^31: host-checked
  const uint32_t* expert_words = speculation + experts + static_cast<int64_t>(x) * words;
  const float amax = warp_amax_nan(thread_amax_of_words<32>(expert_words, words, threadIdx.x % 32));
  if (threadIdx.x % 32 != 0) return;
  const bool held = refit_guess_held(amax, __uint_as_float(__ldcg(speculation + x)));
  workspace[2 * x] = __float_as_uint(amax);
  refit_v12::store_release(workspace + 2 * x + 1, held ? refit_v12::kHeld : refit_v12::kFailed);
}

// The first expert of e, e - 1, ..., 0 whose guess failed, or -1 (every lane of the warp calls it with the same e),
// settling the unknown verdicts on the way.
template <class Cfg>
__device__ __forceinline__ int refit_v12_next_failed_expert(uint32_t* __restrict__ workspace, int experts,
                                                            int64_t per_expert, int e) {
  using namespace refit_v12;
  const int lane = threadIdx.x % 32;
  for (; e >= 0; e -= 32) {
    const int x = e - lane;
    for (;;) {
      const uint32_t state = x >= 0 ? load_acquire(workspace + 2 * x + 1) : kHeld;
      const unsigned unknown = __ballot_sync(0xffffffffu, state == kUnknown);
      if (unknown) {  // claim the first of them
        const int leader = __ffs(unknown) - 1;
        const bool won = __shfl_sync(0xffffffffu,
                                     lane == leader && atomicCAS(workspace + 2 * x + 1, kUnknown, kClaimed) == kUnknown,
                                     leader);
        if (won) refit_v12_settle<Cfg>(workspace, experts, per_expert, e - leader);
        __syncwarp();
        continue;
      }
      if (__ballot_sync(0xffffffffu, state == kClaimed)) {  // another warp settles it
        __nanosleep(64);
        continue;
      }
      const unsigned failed = __ballot_sync(0xffffffffu, state == kFailed);
      if (failed) return e - (__ffs(failed) - 1);
      break;
    }
  }
  return -1;
}

// Phase 1: one wave sharing out the tiles of the experts whose guess failed (v9's walk), verdicts settled on the way.
template <class Cfg>
__device__ __forceinline__ void refit_requantize_v12(const typename Cfg::T* __restrict__ w,
                                                     uint8_t* __restrict__ codes, uint8_t* __restrict__ block_scales,
                                                     float* __restrict__ scales, uint32_t* __restrict__ workspace,
                                                     int experts, int64_t per_expert, int k_dim,
                                                     uint32_t* __restrict__ status) {
  pdl::wait_for_prerequisite_grid();  // phase 0's words, guesses and reset verdicts
  const int64_t tiles = refit_tiles_per_expert<Cfg>(per_expert);
  const int64_t total = experts * tiles, stride = gridDim.x;
  const auto next_failed = [&](int e) { return refit_v12_next_failed_expert<Cfg>(workspace, experts, per_expert, e); };
  const auto next = [&](int64_t g) { return refit_next_failed_tile_of(next_failed, g, experts, tiles, stride); };
  for (int64_t g = next(blockIdx.x); g < total; g = next(g + stride)) {
    const int e = experts - 1 - static_cast<int>(g / tiles);
    const float expert_amax = __uint_as_float(__ldcg(workspace + 2 * e));  // after its verdict's acquire
    refit_requantize_tile<Cfg>(w, codes, block_scales, scales, expert_amax, e, g % tiles, per_expert, k_dim, status);
  }
}

}  // namespace trace_kernels
