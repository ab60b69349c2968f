// In-place weight refit: expert weights w [E, N, K] -> per-expert NVFP4 (scale="tensor": one FP32
// scale per expert, E4M3 blocks of 16 along K) written into preallocated codes [E, N, K/2],
// block_scales [E, N, K/16] and scales [E], whose addresses never change (captured CUDA graphs
// that read them stay valid).
//
// One cooperative launch, one DRAM read of w. The grid is split into groups of CTAS_PER_GROUP
// co-resident CTAs; a group takes experts g, g + groups, ... one at a time: each CTA loads its
// tiles, the group max-reduces |w| through a global atomic, waits at a group barrier (an arrival
// counter), then quantizes. The tile a CTA loaded last is still in registers; others are re-read
// while the expert is hot in L2 (the host sizes groups so that concurrent experts fit in L2).
#pragma once

#include <cuda/atomic>
#include <stdint.h>

#include "trace_kernels/nvfp4.cuh"
#include "trace_kernels/quantize_epilogue.cuh"
#include "trace_kernels/status.cuh"
#include "trace_kernels/vec.cuh"

namespace trace_kernels {

template <typename T_, int CTA_, int KSLOTS_>
struct RefitConfig {
  using T = T_;
  static constexpr int CTA = CTA_;
  static constexpr int kSlots = KSLOTS_;                   // half blocks per thread per tile
  static constexpr int kTileHalfBlocks = CTA * KSLOTS_;    // half blocks per CTA tile
  static_assert(CTA % 64 == 0, "whole warps, even lanes pair into blocks");
};

template <class Cfg>
__device__ __forceinline__ void load_tile(const typename Cfg::T* __restrict__ w, int64_t tile, int64_t half_blocks,
                                          Vec8<typename Cfg::T> (&v)[Cfg::kSlots]) {
#pragma unroll
  for (int k = 0; k < Cfg::kSlots; ++k) {
    const int64_t h = tile * Cfg::kTileHalfBlocks + k * Cfg::CTA + threadIdx.x;
    if (h < half_blocks) v[k].load(w + h * 8);
    else v[k].zero();
  }
}

template <class Cfg>
__device__ __forceinline__ void refit_weights(const typename Cfg::T* __restrict__ w,  // [E, N, K]
                                              uint8_t* __restrict__ codes,            // [E, N, K/2]
                                              uint8_t* __restrict__ block_scales,     // [E, N, K/16] e4m3
                                              float* __restrict__ scales,             // [E]
                                              uint32_t* __restrict__ workspace,       // [2E] zeroed
                                              int experts, int64_t per_expert,        // N * K
                                              int k_dim, int ctas_per_group, uint32_t* __restrict__ status) {
  using T = typename Cfg::T;
  using cuda::memory_order_acquire;
  using cuda::memory_order_relaxed;
  using cuda::memory_order_release;
  __shared__ float warp_amax[Cfg::CTA / 32];
  __shared__ float expert_amax_shared;

  const int groups = gridDim.x / ctas_per_group;
  const int group = blockIdx.x / ctas_per_group;
  const int rank = blockIdx.x % ctas_per_group;
  if (group >= groups) return;  // leftover CTAs (grid not a multiple of the group size)
  const int64_t half_blocks = per_expert / 8;
  const int64_t tiles = (half_blocks + Cfg::kTileHalfBlocks - 1) / Cfg::kTileHalfBlocks;

  Vec8<T> v[Cfg::kSlots];
  for (int e = group; e < experts; e += groups) {
    const T* we = w + static_cast<int64_t>(e) * per_expert;
    // Phase 1: amax over this CTA's tiles (the last one stays in registers).
    float amax = 0.f;
    int64_t last_tile = -1;
    for (int64_t t = rank; t < tiles; t += ctas_per_group) {
      load_tile<Cfg>(we, t, half_blocks, v);
#pragma unroll
      for (int k = 0; k < Cfg::kSlots; ++k) amax = nvfp4::fmax_nan(amax, v[k].abs_max());
      last_tile = t;
    }
#pragma unroll
    for (int offset = 16; offset >= 1; offset /= 2)
      amax = nvfp4::fmax_nan(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
    if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax;
    __syncthreads();
    if (threadIdx.x == 0) {
      float cta_amax = warp_amax[0];
      for (int i = 1; i < Cfg::CTA / 32; ++i) cta_amax = nvfp4::fmax_nan(cta_amax, warp_amax[i]);
      // |w| as bits orders like the float, and NaN (> 0x7f800000) wins the max: detection for free.
      cuda::atomic_ref<uint32_t, cuda::thread_scope_device> amax_bits(workspace[2 * e]);
      cuda::atomic_ref<uint32_t, cuda::thread_scope_device> arrived(workspace[2 * e + 1]);
      amax_bits.fetch_max(__float_as_uint(cta_amax) & 0x7fffffffu, memory_order_relaxed);
      arrived.fetch_add(1u, memory_order_release);
      while (arrived.load(memory_order_acquire) < static_cast<uint32_t>(ctas_per_group)) __nanosleep(64);
      expert_amax_shared = __uint_as_float(amax_bits.load(memory_order_relaxed));
    }
    __syncthreads();
    const float expert_amax = expert_amax_shared;
    __syncthreads();  // expert_amax_shared is rewritten for the next expert

    const bool finite = nvfp4::is_finite(expert_amax);
    const float s = __fdiv_rn(expert_amax, nvfp4::kGlobalDivisor);
    const float six_s = nvfp4::kFp4Max * s;
    if (finite && rank == 0 && threadIdx.x == 0) scales[e] = s;

    // Phase 2: quantize, the register-resident tile first, then the others in reverse order.
    for (int64_t t = last_tile; t >= 0; t -= ctas_per_group) {
      if (t != last_tile) load_tile<Cfg>(we, t, half_blocks, v);
#pragma unroll
      for (int k = 0; k < Cfg::kSlots; ++k) {
        const int64_t h = t * Cfg::kTileHalfBlocks + k * Cfg::CTA + threadIdx.x;
        const float half = v[k].abs_max();
        const float block_amax = nvfp4::fmax_nan(half, __shfl_xor_sync(0xffffffffu, half, 1));
        if (h >= half_blocks) continue;
        if (!finite) {  // leave the previous weights in place; report where the bad values are
          if (!nvfp4::is_finite(half)) {
            float f[8];
            v[k].to_float(f);
            const int64_t flat = h * 8;  // element index inside the expert
            const uint64_t row = static_cast<uint64_t>(e) * (per_expert / k_dim) + flat / k_dim;
            report_nonfinite(status, kStatusRefitWeights, row, static_cast<uint32_t>(flat % k_dim), f);
          }
          continue;
        }
        const nvfp4::BlockStep step = nvfp4::block_step(block_amax, s, six_s);
        uint4 unused;
        const uint32_t q = quantize_vec8<T>(v[k], step, false, unused);
        const int64_t hg = static_cast<int64_t>(e) * half_blocks + h;  // global half-block index
        reinterpret_cast<uint32_t*>(codes)[hg] = q;
        if ((hg & 1) == 0) block_scales[hg / 2] = step.scale_bits;
      }
    }
  }
}

}  // namespace trace_kernels
