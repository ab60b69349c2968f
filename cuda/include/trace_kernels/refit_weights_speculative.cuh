// Speculative refits (v8, v9), for the per-step policy sync of RL.
//
// An optimizer step rarely moves an expert's amax (the largest |w| of millions of BF16 weights changes only when
// its own rounding flips), so the tensor scale the buffers already hold, from the previous refit, is almost always
// the new one. One kernel, launched per phase (grid y = experts in phase 0, like v2):
// phase 0 streams w once: every warp stores its amax bits in a word of its own (written by every call, so nothing
//   needs zeroing) and, when the guess g = scales[e] is a positive finite scale that the warp's own amax does not
//   disprove (the scale is monotone in the amax), writes its codes and block scales as quantize(w[e], scale="tensor")
//   would with s = g. Phase 0 never writes scales; the CTA of tile 0 leaves g in the workspace. No CTA barrier, no
//   atomics; the next launch may start at once (a programmatic dependent launch).
// v8's phase 1 (grid (CTAs per expert, E), experts in reverse so the first re-reads hit what phase 0 left in L2)
//   reduces the expert's warp words (one per 2048 elements, from L2): if RN(amax / 2688) == g, every tile of phase 0
//   wrote exactly the reference's bytes and the CTAs return at once; otherwise they requantize the expert with its
//   amax (v2's quantize tile), scales[e] included.
// v9 gives the verdicts a launch of their own (phase 1, one CTA per expert) and shares the failed experts' tiles out
//   over one wave of CTAs (phase 2) instead of v8's CTAs per expert, most of which return at once in a mixed step.
// A non-finite expert is reported and its block scales become E4M3 NaN: phase 0 may have overwritten part of it, so
// its previous weights are gone, and NaN scales leave no finite garbage behind (v2 keeps the previous weights).
// Traffic: 2.56 bytes per element when every guess holds, plus 4 per 2048 elements of workspace (v2: 4.56 always),
// 5.13 when every guess is valid but wrong (a first refit: buffers hold no positive scale, so phase 0 writes nothing).
#pragma once

#include <type_traits>

#include "trace_kernels/pdl.cuh"
#include "trace_kernels/refit_weights.cuh"

namespace trace_kernels {

// The guess: a positive, finite tensor scale (allocate() zeroes the buffers, so a first refit has none).
__device__ __forceinline__ bool refit_guess_valid(float s) { return s > 0.f && s <= 3.402823466e38f; }

// Whether phase 0 wrote expert e exactly as the reference would: its guess was a scale and equals RN(amax / 2688).
__device__ __forceinline__ bool refit_guess_held(float expert_amax, float guess) {
  return nvfp4::is_finite(expert_amax) && refit_guess_valid(guess) &&
         __fdiv_rn(expert_amax, nvfp4::kGlobalDivisor) == guess;
}

// Phase-0 tiles per expert (refit_quantize_tile's).
template <class Cfg>
__device__ __forceinline__ int64_t refit_tiles_per_expert(int64_t per_expert) {
  const int64_t tile_blocks = static_cast<int64_t>(Cfg::CTA) * Cfg::kQuantizeBlocks;
  return (per_expert / 16 + tile_blocks - 1) / tile_blocks;
}

// Phase 0's workspace (v9's starts after its own [2 E]): [E] each expert's guess, then one word per (expert, tile,
// warp) with that warp's amax bits. Returns the warp's amax (NaN wins), in every lane.
template <class Cfg>
__device__ __forceinline__ float refit_publish_warp_amax(uint32_t* __restrict__ workspace, int experts, int e,
                                                         int64_t t, int64_t tiles, float amax, float guess) {
  amax = warp_amax_nan(amax);
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0)
    workspace[experts + (e * tiles + t) * (Cfg::CTA / 32) + warp] = __float_as_uint(amax) & 0x7fffffffu;
  if (t == 0 && threadIdx.x == 0) workspace[e] = __float_as_uint(guess);
  return amax;
}

// Phase 0, tile t (CTA * kQuantizeBlocks whole blocks, refit_quantize_tile's) of expert e.
template <class Cfg>
__device__ __forceinline__ void refit_speculate_tile(const typename Cfg::T* __restrict__ w, uint8_t* __restrict__ codes,
                                                     uint8_t* __restrict__ block_scales,
                                                     const float* __restrict__ scales, uint32_t* __restrict__ workspace,
                                                     int experts, int64_t per_expert, int e, int64_t t) {
  using T = typename Cfg::T;
  constexpr int kBlocks = Cfg::kQuantizeBlocks;
  const int64_t blocks = per_expert / 16;
  const int64_t tiles = refit_tiles_per_expert<Cfg>(per_expert);
  const T* we = w + static_cast<int64_t>(e) * per_expert;
  const int64_t first = t * Cfg::CTA * kBlocks + threadIdx.x;
  const float guess = __ldg(scales + e);

  Vec8<T> v[kBlocks][2];
#pragma unroll
  for (int k = 0; k < kBlocks; ++k) {  // every load issued before the first use
    const int64_t b = first + k * Cfg::CTA;
    if (b < blocks) {
      v[k][0].load(we + b * 16);
      v[k][1].load(we + b * 16 + 8);
    } else {
      v[k][0].zero();
      v[k][1].zero();
    }
  }
  float block_amax[kBlocks];
  const float amax = refit_publish_warp_amax<Cfg>(workspace, experts, e, t, tiles,
                                                  blocks16_abs_max<T, kBlocks>(v, block_amax), guess);
  // s(amax) = RN(amax / 2688) is monotone, so a warp whose own s exceeds the guess proves it wrong; a non-finite one
  // makes the expert non-finite. Either way a later phase rewrites the expert, and this warp writes nothing.
  if (!refit_guess_valid(guess) || !nvfp4::is_finite(amax) || __fdiv_rn(amax, nvfp4::kGlobalDivisor) > guess) return;
  const RefitExpertScale scale = refit_scale_of(guess);  // finite here
  const auto quantize_blocks = [&](auto fast) {  // the path picked once per tile, the block amaxes reused
#pragma unroll
    for (int k = 0; k < kBlocks; ++k) {
      const int64_t b = first + k * Cfg::CTA;
      if (b < blocks)
        refit_quantize_finite_block<T, decltype(fast)::value>(v[k][0], v[k][1], block_amax[k], scale, e, b, per_expert,
                                                              codes, block_scales);
    }
  };
  if (scale.fast) quantize_blocks(std::true_type{});
  else quantize_blocks(std::false_type{});
}

// Tile t of expert e after a failed guess (or of a non-finite expert), requantized with the expert's finished amax
// (scales[e] by tile 0); a non-finite expert's block scales become E4M3 NaN.
template <class Cfg>
__device__ __forceinline__ void refit_requantize_tile(const typename Cfg::T* __restrict__ w,
                                                      uint8_t* __restrict__ codes, uint8_t* __restrict__ block_scales,
                                                      float* __restrict__ scales, float expert_amax, int e, int64_t t,
                                                      int64_t per_expert, int k_dim, uint32_t* __restrict__ status) {
  refit_quantize_tile<Cfg>(w, codes, block_scales, scales, expert_amax, e, t, per_expert, k_dim, status);
  if (nvfp4::is_finite(expert_amax)) return;
  const int64_t blocks = per_expert / 16;
  const int64_t tile_blocks = static_cast<int64_t>(Cfg::CTA) * Cfg::kQuantizeBlocks;
  for (int64_t b = t * tile_blocks + threadIdx.x; b < blocks && b < (t + 1) * tile_blocks; b += Cfg::CTA)
    block_scales[static_cast<int64_t>(e) * blocks + b] = 0x7f;  // E4M3 NaN
}

// Expert e after a failed guess: the CTA's share of its tiles, blockIdx.x, + gridDim.x, ... (v8's phase 1).
template <class Cfg>
__device__ __forceinline__ void refit_requantize_expert(const typename Cfg::T* __restrict__ w,
                                                        uint8_t* __restrict__ codes, uint8_t* __restrict__ block_scales,
                                                        float* __restrict__ scales, float expert_amax, int e,
                                                        int64_t per_expert, int k_dim, uint32_t* __restrict__ status) {
  const int64_t tiles = refit_tiles_per_expert<Cfg>(per_expert);
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x)
    refit_requantize_tile<Cfg>(w, codes, block_scales, scales, expert_amax, e, t, per_expert, k_dim, status);
}

// Words per expert of phase 0's workspace (after the E guesses): one per warp of each phase-0 tile.
template <class Cfg>
__device__ __forceinline__ int64_t refit_words_per_expert(int64_t per_expert) {
  return refit_tiles_per_expert<Cfg>(per_expert) * (Cfg::CTA / 32);
}

// Expert e's amax: the max (NaN wins) of its warp words from phase 0, over the CTA, in every thread.
template <class Cfg>
__device__ __forceinline__ float refit_expert_amax_of_words(const uint32_t* __restrict__ workspace, int experts, int e,
                                                      int64_t per_expert, float* warp_amax) {
  const int words = static_cast<int>(refit_words_per_expert<Cfg>(per_expert));  // < 2^31: host-checked block count
  const uint32_t* expert_words = workspace + experts + static_cast<int64_t>(e) * words;
  return cta_amax<Cfg>(thread_amax_of_words<Cfg::CTA>(expert_words, words), warp_amax);
}

// Phase 0 of v8 and v9: grid (tiles per expert, E), one tile per CTA.
template <class Cfg>
__device__ __forceinline__ void refit_speculate(const typename Cfg::T* __restrict__ w, uint8_t* __restrict__ codes,
                                                uint8_t* __restrict__ block_scales, const float* __restrict__ scales,
                                                uint32_t* __restrict__ workspace, int experts, int64_t per_expert) {
  pdl::allow_dependent_launch();  // the next phase may become resident once every tile has started; it waits for them
  refit_speculate_tile<Cfg>(w, codes, block_scales, scales, workspace, experts, per_expert, blockIdx.y, blockIdx.x);
}

// v8's phase 1: grid (CTAs per expert, E), experts in reverse (the first re-reads hit what phase 0 left in L2).
template <class Cfg>
__device__ __forceinline__ void refit_settle_v8(const typename Cfg::T* __restrict__ w, uint8_t* __restrict__ codes,
                                                uint8_t* __restrict__ block_scales, float* __restrict__ scales,
                                                const uint32_t* __restrict__ workspace, int experts, int64_t per_expert,
                                                int k_dim, uint32_t* __restrict__ status) {
  __shared__ float warp_amax[Cfg::CTA / 32];
  pdl::wait_for_prerequisite_grid();  // phase 0's words, guesses and codes
  const int e = experts - 1 - static_cast<int>(blockIdx.y);
  const float expert_amax = refit_expert_amax_of_words<Cfg>(workspace, experts, e, per_expert, warp_amax);
  const float guess = __uint_as_float(__ldcg(workspace + e));  // not scales[e]: tile 0 below rewrites it
  if (refit_guess_held(expert_amax, guess)) return;
  refit_requantize_expert<Cfg>(w, codes, block_scales, scales, expert_amax, e, per_expert, k_dim, status);
}

// v9's phase 1, one CTA per expert: its verdict. Workspace: [0, 2 E) per expert its amax bits and 1 when it must be
// requantized, [2 E, ...) phase 0's (guesses, warp words). Phases 1 and 2 are programmatic dependent launches.
template <class Cfg>
__device__ __forceinline__ void refit_verdict_v9(uint32_t* __restrict__ workspace, int experts, int64_t per_expert) {
  __shared__ float warp_amax[Cfg::CTA / 32];
  pdl::allow_dependent_launch();
  pdl::wait_for_prerequisite_grid();  // phase 0's words and guesses
  const uint32_t* speculation = workspace + 2 * experts;
  const int e = blockIdx.x;
  const float expert_amax = refit_expert_amax_of_words<Cfg>(speculation, experts, e, per_expert, warp_amax);
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

// v9's requantize wave (phase 2): global tile g is tile g % tiles of expert experts - 1 - g / tiles (reversed: the
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
