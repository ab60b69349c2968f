// refit v8: v7's speculative one-read refit without phase 0's CTA barrier, atomics and zeroed workspace, and with
// phase 1 launched as a programmatic dependent of phase 0.
//
// v7 spends time outside the stream of w: a memset of the amax words, a CTA barrier per tile before the guess check,
// ~400 resident CTAs' atomic max on one word per expert, and a second launch's gap. v8:
// phase 0 checks the guess per warp (the scale is monotone in the amax, so a warp's own amax disproves it as well as
//   the tile's) and stores each warp's amax bits in a word of its own (refit_publish_amax), written by every call, so
//   nothing needs zeroing. It lets phase 1 launch at once.
// phase 1 (a programmatic dependent launch: its CTAs are resident while phase 0's last wave drains) waits for phase 0,
//   reduces the expert's warp words (one per 2048 elements, from L2) and settles it as v7 does.
// Same bytes as v7: 2.56 per element when every guess holds, plus 4 per 2048 elements of workspace.
#pragma once

#include "trace_kernels/pdl.cuh"
#include "trace_kernels/refit_weights_v7.cuh"

namespace trace_kernels {

// Words per expert of v8's workspace (after the E guesses): one per warp of each phase-0 tile.
template <class Cfg>
__device__ __forceinline__ int64_t refit_v8_words_per_expert(int64_t per_expert) {
  return refit_tiles_per_expert<Cfg>(per_expert) * (Cfg::CTA / 32);
}

// Expert e's amax: the max (NaN wins) of its warp words from phase 0, over the CTA, in every thread.
template <class Cfg>
__device__ __forceinline__ float refit_v8_expert_amax(const uint32_t* __restrict__ workspace, int experts, int e,
                                                      int64_t per_expert, float* warp_amax) {
  const int words = static_cast<int>(refit_v8_words_per_expert<Cfg>(per_expert));  // < 2^31: host-checked block count
  const uint32_t* expert_words = workspace + experts + static_cast<int64_t>(e) * words;
  return cta_amax<Cfg>(thread_amax_of_words<Cfg::CTA>(expert_words, words), warp_amax);
}

template <class Cfg>
__device__ __forceinline__ void refit_speculate_v8(const typename Cfg::T* __restrict__ w, uint8_t* __restrict__ codes,
                                                   uint8_t* __restrict__ block_scales, const float* __restrict__ scales,
                                                   uint32_t* __restrict__ workspace, int experts, int64_t per_expert,
                                                   int k_dim, uint32_t* __restrict__ status) {
  pdl::allow_dependent_launch();  // phase 1 may become resident once every tile has started; it waits for them all
  refit_speculate_v7<Cfg, true>(w, codes, block_scales, scales, workspace, experts, per_expert, k_dim, status);
}

// Phase 1: grid (CTAs per expert, E), experts in reverse (the first re-reads hit what phase 0 left in L2).
template <class Cfg>
__device__ __forceinline__ void refit_settle_v8(const typename Cfg::T* __restrict__ w, uint8_t* __restrict__ codes,
                                                uint8_t* __restrict__ block_scales, float* __restrict__ scales,
                                                const uint32_t* __restrict__ workspace, int experts, int64_t per_expert,
                                                int k_dim, uint32_t* __restrict__ status) {
  __shared__ float warp_amax[Cfg::CTA / 32];
  pdl::wait_for_prerequisite_grid();  // phase 0's words, guesses and codes
  const int e = experts - 1 - static_cast<int>(blockIdx.y);
  const float expert_amax = refit_v8_expert_amax<Cfg>(workspace, experts, e, per_expert, warp_amax);
  const float guess = __uint_as_float(__ldcg(workspace + e));  // not scales[e]: tile 0 below rewrites it
  if (refit_guess_held(expert_amax, guess)) return;
  refit_requantize_expert<Cfg>(w, codes, block_scales, scales, expert_amax, e, per_expert, k_dim, status);
}

// v9: v8's phase 0, then the verdict per expert in a launch of its own (phase 1, grid E), then one wave of CTAs that
// shares out the tiles of every expert whose guess failed (phase 2), instead of v8's CTAs per expert, most of which
// return at once when a quarter of the experts failed. Workspace: [0, 2 E) per expert its amax bits and 1 when it
// must be requantized, [2 E, ...) v8's (guesses, warp words). Phases 1 and 2 are programmatic dependent launches.
template <class Cfg>
__device__ __forceinline__ void refit_verdict_v9(uint32_t* __restrict__ workspace, int experts, int64_t per_expert) {
  __shared__ float warp_amax[Cfg::CTA / 32];
  pdl::allow_dependent_launch();
  pdl::wait_for_prerequisite_grid();  // phase 0's words and guesses
  const uint32_t* speculation = workspace + 2 * experts;
  const int e = blockIdx.x;
  const float expert_amax = refit_v8_expert_amax<Cfg>(speculation, experts, e, per_expert, warp_amax);
  if (threadIdx.x != 0) return;
  const bool held = refit_guess_held(expert_amax, __uint_as_float(__ldcg(speculation + e)));
  workspace[2 * e] = __float_as_uint(expert_amax);
  workspace[2 * e + 1] = held ? 0u : 1u;
}

// The first expert x of e, e - 1, ..., 0 for which failed_expert(x) holds, or -1: the warp tests 32 of them at once
// (every lane of the warp calls it with the same e). A chain of one load per expert cost v9's first build ~60 us at
// 170 experts on steady weights. refit_next_failed_expert: the verdict word verdicts[2 x + 1] set.
template <class Failed>
__device__ __forceinline__ int refit_next_expert_where(Failed failed_expert, int e) {
  const int lane = threadIdx.x % 32;
  for (; e >= 0; e -= 32) {
    const unsigned failed = __ballot_sync(0xffffffffu, e - lane >= 0 && failed_expert(e - lane));
    if (failed) return e - (__ffs(failed) - 1);
  }
  return -1;
}

// Whether expert x must be requantized: v9's verdict word verdicts[2 x + 1] (refit_weights_packed_ v2's too) is set.
__device__ __forceinline__ bool refit_verdict_failed(const uint32_t* __restrict__ verdicts, int x) {
  return __ldcg(verdicts + 2 * x + 1) != 0u;
}

__device__ __forceinline__ int refit_next_failed_expert(const uint32_t* __restrict__ verdicts, int e) {
  return refit_next_expert_where([verdicts](int x) { return refit_verdict_failed(verdicts, x); }, e);
}

// v9's and v11's requantize waves: global tile g is tile g % tiles of expert experts - 1 - g / tiles (reversed: the
// first re-reads hit what phase 0 left in L2). The first g' >= g in g's residue mod stride whose expert failed, or
// experts * tiles; held experts are passed in one jump.
template <class Failed>
__device__ __forceinline__ int64_t refit_next_failed_tile(Failed failed_expert, int64_t g, int experts, int64_t tiles,
                                                          int64_t stride) {
  const int64_t total = experts * tiles;
  while (g < total) {
    const int e = experts - 1 - static_cast<int>(g / tiles);
    const int failed = refit_next_expert_where(failed_expert, e);
    if (failed < 0) return total;
    if (failed == e) return g;
    g += ((experts - 1 - failed) * tiles - g + stride - 1) / stride * stride;  // its first tile in g's residue
  }
  return g;
}

template <class Cfg>
__device__ __forceinline__ void refit_requantize_v9(const typename Cfg::T* __restrict__ w, uint8_t* __restrict__ codes,
                                                    uint8_t* __restrict__ block_scales, float* __restrict__ scales,
                                                    const uint32_t* __restrict__ workspace, int experts,
                                                    int64_t per_expert, int k_dim, uint32_t* __restrict__ status) {
  pdl::wait_for_prerequisite_grid();  // phase 1's verdicts (phase 1 waited for phase 0)
  const int64_t tiles = refit_tiles_per_expert<Cfg>(per_expert);
  const int64_t total = experts * tiles, stride = gridDim.x;
  const auto failed = [workspace](int x) { return refit_verdict_failed(workspace, x); };
  const auto next = [&](int64_t g) { return refit_next_failed_tile(failed, g, experts, tiles, stride); };
  for (int64_t g = next(blockIdx.x); g < total; g = next(g + stride)) {
    const int e = experts - 1 - static_cast<int>(g / tiles);
    const float expert_amax = __uint_as_float(__ldcg(workspace + 2 * e));
    refit_requantize_tile<Cfg>(w, codes, block_scales, scales, expert_amax, e, g % tiles, per_expert, k_dim, status);
  }
}

}  // namespace trace_kernels
