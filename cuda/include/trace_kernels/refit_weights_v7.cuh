// refit v7: a speculative one-read refit, for the per-step policy sync of RL.
//
// An optimizer step rarely moves an expert's amax (the largest |w| of millions of BF16 weights changes only when
// its own rounding flips), so the tensor scale the buffers already hold, from the previous refit, is almost always
// the new one. Two plain launches of one kernel (grid y = experts, like v2):
// phase 0 streams w once: every tile adds its amax to the expert's (workspace[2 e]) and, when the guess
//   g = scales[e] is a positive finite scale that the tile does not already disprove (its own amax / 2688 > g),
//   writes its codes and block scales as quantize(w[e], scale="tensor") would with s = g. Phase 0 never writes
//   scales; the CTA of tile 0 leaves g in workspace[2 e + 1] for phase 1.
// phase 1 settles each expert: if RN(amax / 2688) == g, every tile of phase 0 wrote exactly the reference's bytes
//   and the CTAs return at once; otherwise they requantize the expert with its amax (v2's quantize tile, experts in
//   reverse so the first re-reads hit what phase 0 left in L2), scales[e] included. A non-finite expert is reported
//   and its block scales become E4M3 NaN: phase 0 may have overwritten part of it, so its previous weights are gone,
//   and NaN scales leave no finite garbage behind (unlike v1..v6, which keep the previous weights).
// Traffic: 2.56 bytes per element when every guess holds (v2: 4.56 always), 5.13 when every guess is valid but wrong
// (first refit: buffers hold no positive scale, so phase 0 writes nothing and v7 moves v2's bytes).
// v8 and v9 (refit_weights_v8.cuh) reuse phase 0 with a warp-level check (kWarpEntries), the guess test and the
// requantize tile below.
#pragma once

#include <type_traits>

#include "trace_kernels/refit_weights.cuh"

namespace trace_kernels {

// The guess: a positive, finite tensor scale (allocate() zeroes the buffers, so a first refit has none).
__device__ __forceinline__ bool refit_v7_guess_valid(float s) { return s > 0.f && s <= 3.402823466e38f; }

// Whether phase 0 wrote expert e exactly as the reference would: its guess was a scale and equals RN(amax / 2688).
__device__ __forceinline__ bool refit_guess_held(float expert_amax, float guess) {
  return nvfp4::is_finite(expert_amax) && refit_v7_guess_valid(guess) &&
         __fdiv_rn(expert_amax, nvfp4::kGlobalDivisor) == guess;
}

// Phase-0 tiles per expert (refit_quantize_tile's).
template <class Cfg>
__device__ __forceinline__ int64_t refit_tiles_per_expert(int64_t per_expert) {
  const int64_t tile_blocks = static_cast<int64_t>(Cfg::CTA) * Cfg::kQuantizeBlocks;
  return (per_expert / 16 + tile_blocks - 1) / tile_blocks;
}

// Where phase 0 leaves each expert's amax and guess for phase 1. v7: workspace [2 E] zeroed, word 2 e the amax bits
// (one atomic max per CTA, after a CTA barrier), 2 e + 1 the guess. v8: workspace [E + E * tiles * warps], not zeroed:
// word e the guess, then one word per (expert, tile, warp) with that warp's amax bits (a plain store, every call),
// so phase 0 has no CTA barrier and no atomics, and phase 1 reduces the expert's words itself. Returns the amax the
// caller checks the guess against: the CTA's (v7) or the warp's (v8).
template <class Cfg, bool kWarpEntries>
__device__ __forceinline__ float refit_publish_amax(uint32_t* __restrict__ workspace, int experts, int e, int64_t t,
                                                    int64_t tiles, float amax, float guess, float* warp_amax_shared) {
  if constexpr (kWarpEntries) {
    amax = warp_amax_nan(amax);  // every lane: each warp checks the guess against its own amax
    const int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0)
      workspace[experts + (e * tiles + t) * (Cfg::CTA / 32) + warp] = __float_as_uint(amax) & 0x7fffffffu;
    if (t == 0 && threadIdx.x == 0) workspace[e] = __float_as_uint(guess);
  } else {
    amax = cta_amax<Cfg>(amax, warp_amax_shared);
    if (threadIdx.x == 0) {
      atomicMax(workspace + 2 * e, __float_as_uint(amax) & 0x7fffffffu);  // NaN bits win
      if (t == 0) workspace[2 * e + 1] = __float_as_uint(guess);
    }
  }
  return amax;
}

// Phase 0, tile t (CTA * kQuantizeBlocks whole blocks, refit_quantize_tile's) of expert e; kWarpEntries: v8's words.
// kMarks (v11): with a valid guess, lane 0 of a warp whose own scale exceeds the guess (or whose amax is not finite)
// stores epoch in marks[experts + e] ("disproved"), one whose scale equals it in marks[e] ("confirmed").
template <class Cfg, bool kWarpEntries = false, bool kMarks = false>
__device__ __forceinline__ void refit_speculate_tile(const typename Cfg::T* __restrict__ w, uint8_t* __restrict__ codes,
                                                     uint8_t* __restrict__ block_scales,
                                                     const float* __restrict__ scales, uint32_t* __restrict__ workspace,
                                                     int experts, int64_t per_expert, int k_dim, int e, int64_t t,
                                                     uint32_t* __restrict__ status, uint32_t* __restrict__ marks = nullptr,
                                                     uint32_t epoch = 0) {
  using T = typename Cfg::T;
  constexpr int kBlocks = Cfg::kQuantizeBlocks;
  __shared__ float warp_amax[kWarpEntries ? 1 : Cfg::CTA / 32];
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
  float amax = 0.f;
#pragma unroll
  for (int k = 0; k < kBlocks; ++k) {
    block_amax[k] = block16_abs_max<T>(v[k][0], v[k][1]);
    amax = nvfp4::fmax_nan(amax, block_amax[k]);
  }
  amax = refit_publish_amax<Cfg, kWarpEntries>(workspace, experts, e, t, tiles, amax, guess, warp_amax);
  if constexpr (kMarks) {
    if (threadIdx.x % 32 == 0 && refit_v7_guess_valid(guess)) {
      const float warp_scale = __fdiv_rn(amax, nvfp4::kGlobalDivisor);
      if (!nvfp4::is_finite(amax) || warp_scale > guess) marks[experts + e] = epoch;
      else if (warp_scale == guess) marks[e] = epoch;
    }
  }
  // s(amax) = RN(amax / 2688) is monotone, so a tile (v8: a warp) whose own s exceeds the guess proves it wrong; a
  // non-finite one makes the expert non-finite. Either way phase 1 rewrites the expert, and this one writes nothing.
  if (!refit_v7_guess_valid(guess) || !nvfp4::is_finite(amax) || __fdiv_rn(amax, nvfp4::kGlobalDivisor) > guess) return;
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

// Phase 0 of v7 and v8: grid (tiles per expert, E), one tile per CTA.
template <class Cfg, bool kWarpEntries = false>
__device__ __forceinline__ void refit_speculate_v7(const typename Cfg::T* __restrict__ w, uint8_t* __restrict__ codes,
                                                   uint8_t* __restrict__ block_scales, const float* __restrict__ scales,
                                                   uint32_t* __restrict__ workspace, int experts, int64_t per_expert,
                                                   int k_dim, uint32_t* __restrict__ status) {
  refit_speculate_tile<Cfg, kWarpEntries>(w, codes, block_scales, scales, workspace, experts, per_expert, k_dim,
                                          blockIdx.y, blockIdx.x, status);
}

// Tile t of expert e after a failed guess (or of a non-finite expert), requantized with the expert's finished amax
// (scales[e] by tile 0); a non-finite expert's block scales become E4M3 NaN. The phase that settles v7, v8 and v9.
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

// Expert e after a failed guess: the CTA's share of its tiles, blockIdx.x, + gridDim.x, ... (v7's and v8's phase 1).
template <class Cfg>
__device__ __forceinline__ void refit_requantize_expert(const typename Cfg::T* __restrict__ w,
                                                        uint8_t* __restrict__ codes, uint8_t* __restrict__ block_scales,
                                                        float* __restrict__ scales, float expert_amax, int e,
                                                        int64_t per_expert, int k_dim, uint32_t* __restrict__ status) {
  const int64_t tiles = refit_tiles_per_expert<Cfg>(per_expert);
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x)
    refit_requantize_tile<Cfg>(w, codes, block_scales, scales, expert_amax, e, t, per_expert, k_dim, status);
}

// Phase 1: grid (CTAs per expert, E); each CTA requantizes its share of the expert's tiles when the guess did not hold.
template <class Cfg>
__device__ __forceinline__ void refit_settle_v7(const typename Cfg::T* __restrict__ w, uint8_t* __restrict__ codes,
                                                uint8_t* __restrict__ block_scales, float* __restrict__ scales,
                                                const uint32_t* __restrict__ workspace, int experts, int64_t per_expert,
                                                int k_dim, uint32_t* __restrict__ status) {
  const int e = experts - 1 - static_cast<int>(blockIdx.y);
  const float expert_amax = __uint_as_float(__ldcg(workspace + 2 * e));
  const float guess = __uint_as_float(__ldcg(workspace + 2 * e + 1));  // not scales[e]: tile 0 below rewrites it
  if (refit_guess_held(expert_amax, guess)) return;
  refit_requantize_expert<Cfg>(w, codes, block_scales, scales, expert_amax, e, per_expert, k_dim, status);
}

}  // namespace trace_kernels
