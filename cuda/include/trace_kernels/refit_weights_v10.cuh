// refit v10: v9's speculative refit in one launch.
//
// v9 runs three kernels: phase 0 (quantize with the previous scale as a guess, per-warp amax words), the verdicts,
// and a wave that requantizes the experts whose guess failed. v10 does the same work in one persistent launch:
// - phase 0: CTAs claim tiles in expert order from a counter (claimed one tile ahead, so the claim's latency hides
//   behind a tile) and run v8's tile (refit_speculate_tile). Each finished tile counts one arrival on its expert.
// - the CTA whose tile is an expert's last gives that expert's verdict at once: it reduces the expert's warp words
//   and, when the guess failed, appends the expert to the failed list (after its amax).
// - phase 1: once phase-0 tiles run out, CTAs claim requantize items (expert slot x tile of the failed list); an item
//   past the list waits until the list grows or every verdict is in, then the CTA leaves.
// No CTA waits for a tile that no running CTA holds: tiles and items are claimed by running CTAs only, so the grid need
// not be co-resident (it is one wave of resident CTAs for speed). Counters (int32 [8 + 3 E]) are zeroed once by the
// host and reset by the last CTA to leave, so nothing is zeroed per call; the warp words are v8's, rewritten by every
// call. Same bytes as v9: 2.56 per element when every guess holds. Slower than v9 on the H200 (docs/toolchain.md,
// "refit v10"): each arrival is a release whose fence waits for thread 0's code stores, and the CTA waits for it
// before its next tile; v9 gets that ordering from its kernel boundaries.
#pragma once

#include <cuda/atomic>

#include "trace_kernels/refit_weights_v8.cuh"

namespace trace_kernels {

// Counter words of v10: a header, then per expert its arrivals (phase-0 tiles done), the failed list (expert + 1, in
// verdict order) and the amax bits of the failed experts.
namespace refit_v10 {
constexpr int kTilesClaimed = 0;       // phase-0 tiles handed out
constexpr int kSettled = 1;            // experts whose verdict is in
constexpr int kFailed = 2;             // entries of the failed list
constexpr int kRequantizeClaimed = 3;  // requantize items handed out (each CTA claims one past the last)
constexpr int kExited = 4;             // CTAs that have left
constexpr int kHeader = 8;

using Counter = cuda::atomic_ref<uint32_t, cuda::thread_scope_device>;
}  // namespace refit_v10

// The verdict on expert e, by the CTA whose tile was its last: every tile's words are visible (thread 0's acq_rel
// arrival saw every other tile's release, and the caller's barrier passed that on to the CTA).
template <class Cfg>
__device__ __forceinline__ void refit_v10_settle(const uint32_t* __restrict__ words, uint32_t* __restrict__ counters,
                                                 int experts, int e, int64_t per_expert, float* warp_amax) {
  using refit_v10::Counter;
  const float expert_amax = refit_v8_expert_amax<Cfg>(words, experts, e, per_expert, warp_amax);
  if (threadIdx.x != 0) return;
  uint32_t* arrivals = counters + refit_v10::kHeader;
  uint32_t* failed_list = arrivals + experts;
  uint32_t* amax_bits = failed_list + experts;
  arrivals[e] = 0u;  // no other tile of e arrives in this launch
  if (!refit_guess_held(expert_amax, __uint_as_float(__ldcg(words + e)))) {  // words[e]: tile 0's guess
    amax_bits[e] = __float_as_uint(expert_amax);
    const uint32_t slot = Counter(counters[refit_v10::kFailed]).fetch_add(1u, cuda::memory_order_relaxed);
    Counter(failed_list[slot]).store(static_cast<uint32_t>(e) + 1u, cuda::memory_order_release);  // after amax_bits
  }
  Counter(counters[refit_v10::kSettled]).fetch_add(1u, cuda::memory_order_release);  // after the failed count
}

// Requantize item c (slot c / tiles of the failed list, tile c % tiles) for thread 0 of a CTA: the slot's expert, or -1
// when every verdict is in and the list ends before c. Bounded like wait_for_arrivals.
__device__ __forceinline__ int refit_v10_wait_for_item(uint32_t* __restrict__ counters, int experts, int64_t tiles,
                                                       uint32_t c) {
  using refit_v10::Counter;
  uint32_t* failed_list = counters + refit_v10::kHeader + experts;
  uint32_t spins = 0;
  for (;;) {
    const uint32_t settled = Counter(counters[refit_v10::kSettled]).load(cuda::memory_order_acquire);
    const uint32_t failed = Counter(counters[refit_v10::kFailed]).load(cuda::memory_order_relaxed);
    if (c / tiles < failed) break;
    if (settled == static_cast<uint32_t>(experts)) return -1;  // the failed count read after it is final
    __nanosleep(256);
    if (++spins > (1u << 24)) __trap();
  }
  uint32_t entry;  // the slot was claimed before its expert was stored: wait for the store
  while ((entry = Counter(failed_list[c / tiles]).load(cuda::memory_order_acquire)) == 0u) __nanosleep(32);
  return static_cast<int>(entry) - 1;
}

// The whole kernel. words: v8's workspace (E guesses, then one word per (expert, tile, warp)), not zeroed;
// counters: int32 [kHeader + 3 E], zero before the launch and zero again after it.
template <class Cfg>
__device__ __forceinline__ void refit_single_launch_v10(const typename Cfg::T* __restrict__ w,
                                                        uint8_t* __restrict__ codes, uint8_t* __restrict__ block_scales,
                                                        float* __restrict__ scales, uint32_t* __restrict__ words,
                                                        uint32_t* __restrict__ counters, int experts,
                                                        int64_t per_expert, int k_dim, uint32_t* __restrict__ status) {
  using refit_v10::Counter;
  __shared__ int item_shared, flag_shared;
  __shared__ float warp_amax[Cfg::CTA / 32];
  const int64_t tiles = refit_tiles_per_expert<Cfg>(per_expert);
  const int total = static_cast<int>(experts * tiles);  // < 2^31, checked on the host
  uint32_t* arrivals = counters + refit_v10::kHeader;
  Counter tiles_claimed(counters[refit_v10::kTilesClaimed]);

  if (threadIdx.x == 0) item_shared = static_cast<int>(tiles_claimed.fetch_add(1u, cuda::memory_order_relaxed));
  __syncthreads();
  for (int g = item_shared; g < total;) {
    int next = 0;
    if (threadIdx.x == 0) next = static_cast<int>(tiles_claimed.fetch_add(1u, cuda::memory_order_relaxed));
    const int e = g / static_cast<int>(tiles);
    refit_speculate_tile<Cfg, true>(w, codes, block_scales, scales, words, experts, per_expert, k_dim, e, g % tiles,
                                    status);
    __syncthreads();  // every warp's word of this tile is stored
    if (threadIdx.x == 0) {
      const uint32_t before = Counter(arrivals[e]).fetch_add(1u, cuda::memory_order_acq_rel);
      flag_shared = before == static_cast<uint32_t>(tiles - 1);
      item_shared = next;
    }
    __syncthreads();
    const bool last_of_expert = flag_shared;
    g = item_shared;
    if (last_of_expert) refit_v10_settle<Cfg>(words, counters, experts, e, per_expert, warp_amax);
  }
  __syncthreads();  // every thread has read item_shared and flag_shared: phase 1 reuses them

  Counter requantize_claimed(counters[refit_v10::kRequantizeClaimed]);
  for (;;) {
    if (threadIdx.x == 0) {
      const uint32_t c = requantize_claimed.fetch_add(1u, cuda::memory_order_relaxed);
      item_shared = static_cast<int>(c);
      flag_shared = refit_v10_wait_for_item(counters, experts, tiles, c);
    }
    __syncthreads();
    const int c = item_shared, e = flag_shared;
    if (e < 0) break;
    const float expert_amax = __uint_as_float(__ldcg(counters + refit_v10::kHeader + 2 * experts + e));
    refit_requantize_tile<Cfg>(w, codes, block_scales, scales, expert_amax, e, c % tiles, per_expert, k_dim, status);
    __syncthreads();  // item_shared and flag_shared are rewritten next
  }

  if (threadIdx.x == 0 && Counter(counters[refit_v10::kExited]).fetch_add(1u, cuda::memory_order_acq_rel) ==
                              gridDim.x - 1) {  // the last CTA: leave the counters zeroed for the next launch
    uint32_t* failed_list = arrivals + experts;
    const uint32_t failed = counters[refit_v10::kFailed];
    for (uint32_t i = 0; i < failed; ++i) failed_list[i] = 0u;
    for (int i = 0; i < refit_v10::kHeader; ++i) counters[i] = 0u;
  }
}

}  // namespace trace_kernels
