// In-place weight refit: expert weights w [E, N, K] -> per-expert NVFP4 (scale="tensor": one FP32
// scale per expert, E4M3 blocks of 16 along K) written into preallocated codes [E, N, K/2],
// block_scales [E, N, K/16] and scales [E], whose addresses never change (captured CUDA graphs
// that read them stay valid).
//
// Variants (RefitConfig::kVariant; refit_weights_kernel.cuh dispatches):
// v2: two ordinary launches of the same kernel, no inter-CTA waiting: phase 0 streams w once for
// the per-expert amax (a global atomic max per CTA), phase 1 streams w again and quantizes whole
// blocks per thread (quantize_block16), experts in reverse order so that its first reads hit
// what phase 0 left in L2. 4.56 bytes per element.
// v8, v9 (refit_weights_speculative.cuh): the previous refit's scale as a guess, one read of w when it holds.
// The variants that lost to these on the H200 (v1, v3..v7, v10, v11) were removed; docs/toolchain.md keeps their
// measurements.
#pragma once

#include <stdint.h>

#include "trace_kernels/nvfp4.cuh"
#include "trace_kernels/quantize_epilogue.cuh"
#include "trace_kernels/status.cuh"
#include "trace_kernels/vec.cuh"

namespace trace_kernels {

template <typename T_, int CTA_, int KSLOTS_, int VARIANT_>
struct RefitConfig {
  using T = T_;
  static constexpr int CTA = CTA_;
  static constexpr int kVariant = VARIANT_;
  static_assert(VARIANT_ == 2 || VARIANT_ == 8 || VARIANT_ == 9, "variants: 2, 8, 9");
  static constexpr int kSlots = KSLOTS_;                   // half blocks per thread in an amax tile (v2 phase 0)
  static constexpr int kQuantizeBlocks = KSLOTS_ / 2;      // whole blocks per thread in a quantize tile
  static_assert(KSLOTS_ % 2 == 0, "whole blocks (pairs of half blocks) per thread");
  static constexpr int kTileHalfBlocks = CTA * KSLOTS_;    // half blocks per CTA tile
  static_assert(CTA % 64 == 0, "whole warps, even lanes pair into blocks");
};

// Tile `tile` of kTileHalfBlocks half blocks of one expert's w, kSlots per thread strided by CTA (zeros past the end).
template <class Cfg>
__device__ __forceinline__ void load_tile(const typename Cfg::T* __restrict__ w, int64_t tile, int64_t half_blocks,
                                          Vec8<typename Cfg::T> (&v)[Cfg::kSlots]) {
#pragma unroll
  for (int k = 0; k < Cfg::kSlots; ++k) {
    const int64_t h = tile * Cfg::kTileHalfBlocks + k * Cfg::CTA + threadIdx.x;
    if (h >= half_blocks) v[k].zero();
    else v[k].load(w + h * 8);
  }
}

// amax over the warp (NaN wins), in every lane.
__device__ __forceinline__ float warp_amax_nan(float amax) {
#pragma unroll
  for (int offset = 16; offset >= 1; offset /= 2)
    amax = nvfp4::fmax_nan(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  return amax;
}

// amax over the CTA's per-warp amaxes in shared memory (NaN wins).
template <class Cfg>
__device__ __forceinline__ float cta_amax_of_warps(const float* warp_amax) {
  float cta_amax = warp_amax[0];
  for (int i = 1; i < Cfg::CTA / 32; ++i) cta_amax = nvfp4::fmax_nan(cta_amax, warp_amax[i]);
  return cta_amax;
}

// amax over the CTA of every thread's amax (NaN wins), returned to every thread: a warp tree, one
// shared slot per warp, one CTA barrier (warp_amax may be rewritten only after another barrier).
template <class Cfg>
__device__ __forceinline__ float cta_amax(float amax, float* warp_amax) {
  amax = warp_amax_nan(amax);
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax;
  __syncthreads();
  return cta_amax_of_warps<Cfg>(warp_amax);
}

// This thread's max (NaN wins) of the amax words words[threadIdx.x + j * kThreads] < count, their loads issued kBatch
// at a time: one L2 round trip per batch instead of one per word (with the per-word loop v9's verdict kernel took
// 4.3 us under Nsight Compute at 64 MB, most of it waiting on those loads).
template <int kThreads, int kBatch = 8>
__device__ __forceinline__ float thread_amax_of_words(const uint32_t* __restrict__ words, int count) {
  float amax = 0.f;
  for (int base = threadIdx.x; base < count; base += kThreads * kBatch) {
    uint32_t bits[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) bits[j] = base + j * kThreads < count ? __ldcg(words + base + j * kThreads) : 0u;
#pragma unroll
    for (int j = 0; j < kBatch; ++j) amax = nvfp4::fmax_nan(amax, __uint_as_float(bits[j]));
  }
  return amax;
}

// v2, phase 0: amax of |w| per expert. grid = (tiles per expert, E); one tile of CTA * kSlots half
// blocks per CTA, every load issued before the first use; one atomic max per CTA into
// workspace[2 e] (|w| bits order like the floats, and NaN bits win the max).
template <class Cfg>
__device__ __forceinline__ void refit_amax_v2(const typename Cfg::T* __restrict__ w, uint32_t* __restrict__ workspace,
                                              int64_t per_expert) {
  __shared__ float warp_amax[Cfg::CTA / 32];
  const int e = blockIdx.y;
  const int64_t half_blocks = per_expert / 8;
  Vec8<typename Cfg::T> v[Cfg::kSlots];
  load_tile<Cfg>(w + static_cast<int64_t>(e) * per_expert, blockIdx.x, half_blocks, v);
  float amax = 0.f;
#pragma unroll
  for (int k = 0; k < Cfg::kSlots; ++k) amax = nvfp4::fmax_nan(amax, v[k].abs_max());
  amax = cta_amax<Cfg>(amax, warp_amax);
  if (threadIdx.x == 0) atomicMax(workspace + 2 * e, __float_as_uint(amax) & 0x7fffffffu);
}

// Expert e's FP32 scale s = amax / (6 * 448) and what its blocks' quantization derives from it once
// (refit_quantize_block here, refit_packed.cuh's records).
struct RefitExpertScale {
  bool finite;  // the expert's amax is finite (else its buffers stay as they are and bad values are reported)
  bool fast;    // row_scale_fast(s): branch-free blocks (quantize_epilogue.cuh)
  float s, six_s;
  nvfp4::Divisor six_s_div;
};

// From the scale itself (a speculative refit's guess); finite exactly when the amax it came from is.
__device__ __forceinline__ RefitExpertScale refit_scale_of(float s) {
  RefitExpertScale r;
  r.finite = nvfp4::is_finite(s);
  r.s = s;
  r.six_s = nvfp4::kFp4Max * r.s;
  r.fast = row_scale_fast(r.s);
  r.six_s_div = nvfp4::make_divisor(r.six_s);
  return r;
}

__device__ __forceinline__ RefitExpertScale refit_expert_scale(float expert_amax) {
  return refit_scale_of(__fdiv_rn(expert_amax, nvfp4::kGlobalDivisor));
}

// Block b (16 elements lo, hi) of expert e with the expert's finished scale: its 8 code bytes and E4M3
// scale, or, for a non-finite expert, a report of the block's bad halves (the buffers stay as they are).
template <typename T>
__device__ __forceinline__ void refit_quantize_block(const Vec8<T>& lo, const Vec8<T>& hi, const RefitExpertScale& scale,
                                                     int e, int64_t b, int64_t per_expert, int k_dim,
                                                     uint8_t* __restrict__ codes, uint8_t* __restrict__ block_scales,
                                                     uint32_t* __restrict__ status) {
  if (!scale.finite) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const Vec8<T>& v = half ? hi : lo;
      if (nvfp4::is_finite(v.abs_max())) continue;
      float f[8];
      v.to_float(f);
      const int64_t flat = b * 16 + half * 8;  // element index inside the expert
      const uint64_t row = static_cast<uint64_t>(e) * (per_expert / k_dim) + flat / k_dim;
      report_nonfinite(status, kStatusRefitWeights, row, static_cast<uint32_t>(flat % k_dim), f);
    }
    return;
  }
  const float block_amax = block16_abs_max<T>(lo, hi);
  uint4 unused_lo, unused_hi;
  const nvfp4::BlockStep step = scale.fast ? block_step_fast(block_amax, scale.s, scale.six_s_div)
                                           : nvfp4::block_step(block_amax, scale.s, scale.six_s);
  const uint2 q = scale.fast ? quantize_block16_fast<T, false>(lo, hi, step, unused_lo, unused_hi)
                             : quantize_block16<T>(lo, hi, step, false, unused_lo, unused_hi);
  const int64_t bg = static_cast<int64_t>(e) * (per_expert / 16) + b;  // global block index
  reinterpret_cast<uint2*>(codes)[bg] = q;
  block_scales[bg] = step.scale_bits;
}

// Block b of expert e with a finite expert scale whose fast / exact path the caller picked (kFast = scale.fast) and
// the block's amax already taken: refit_quantize_block's bytes without its per-block checks (speculative phase 0).
template <typename T, bool kFast>
__device__ __forceinline__ void refit_quantize_finite_block(const Vec8<T>& lo, const Vec8<T>& hi, float block_amax,
                                                            const RefitExpertScale& scale, int e, int64_t b,
                                                            int64_t per_expert, uint8_t* __restrict__ codes,
                                                            uint8_t* __restrict__ block_scales) {
  uint4 unused_lo, unused_hi;
  nvfp4::BlockStep step;
  uint2 q;
  if constexpr (kFast) {
    step = block_step_fast(block_amax, scale.s, scale.six_s_div);
    q = quantize_block16_fast<T, false>(lo, hi, step, unused_lo, unused_hi);
  } else {
    step = nvfp4::block_step(block_amax, scale.s, scale.six_s);
    q = quantize_block16<T>(lo, hi, step, false, unused_lo, unused_hi);
  }
  const int64_t bg = static_cast<int64_t>(e) * (per_expert / 16) + b;  // global block index
  reinterpret_cast<uint2*>(codes)[bg] = q;
  block_scales[bg] = step.scale_bits;
}

// One tile (CTA * kQuantizeBlocks whole blocks, the same elements as load_tile's tile) of expert e,
// quantized with the expert's finished amax: each thread owns blocks strided by CTA (consecutive
// lanes, consecutive 32-byte blocks), all loads issued first. The tile-0 CTA writes the scale.
template <class Cfg>
__device__ __forceinline__ void refit_quantize_tile(const typename Cfg::T* __restrict__ w, uint8_t* __restrict__ codes,
                                                    uint8_t* __restrict__ block_scales, float* __restrict__ scales,
                                                    float expert_amax, int e, int64_t tile, int64_t per_expert,
                                                    int k_dim, uint32_t* __restrict__ status) {
  using T = typename Cfg::T;
  constexpr int kBlocks = Cfg::kQuantizeBlocks;
  const int64_t blocks = per_expert / 16;
  const T* we = w + static_cast<int64_t>(e) * per_expert;
  const int64_t first = tile * Cfg::CTA * kBlocks + threadIdx.x;

  Vec8<T> v[kBlocks][2];
#pragma unroll
  for (int k = 0; k < kBlocks; ++k) {
    const int64_t b = first + k * Cfg::CTA;
    if (b < blocks) {  // the second half of each 32-byte sector comes from L1
      v[k][0].load(we + b * 16);
      v[k][1].load(we + b * 16 + 8);
    } else {
      v[k][0].zero();
      v[k][1].zero();
    }
  }
  const RefitExpertScale scale = refit_expert_scale(expert_amax);
  if (scale.finite && tile == 0 && threadIdx.x == 0) scales[e] = scale.s;
#pragma unroll
  for (int k = 0; k < kBlocks; ++k) {
    const int64_t b = first + k * Cfg::CTA;
    if (b < blocks) refit_quantize_block<T>(v[k][0], v[k][1], scale, e, b, per_expert, k_dim, codes, block_scales, status);
  }
}

// v2, phase 1: quantize with the finished amax. grid = (tiles per expert, E), experts in reverse.
template <class Cfg>
__device__ __forceinline__ void refit_quantize_v2(const typename Cfg::T* __restrict__ w, uint8_t* __restrict__ codes,
                                                  uint8_t* __restrict__ block_scales, float* __restrict__ scales,
                                                  const uint32_t* __restrict__ workspace, int experts,
                                                  int64_t per_expert, int k_dim, uint32_t* __restrict__ status) {
  const int e = experts - 1 - static_cast<int>(blockIdx.y);
  const float expert_amax = __uint_as_float(__ldcg(workspace + 2 * e));
  refit_quantize_tile<Cfg>(w, codes, block_scales, scales, expert_amax, e, blockIdx.x, per_expert, k_dim, status);
}

}  // namespace trace_kernels
