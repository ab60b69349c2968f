// In-place weight refit: expert weights w [E, N, K] -> per-expert NVFP4 (scale="tensor": one FP32
// scale per expert, E4M3 blocks of 16 along K) written into preallocated codes [E, N, K/2],
// block_scales [E, N, K/16] and scales [E], whose addresses never change (captured CUDA graphs
// that read them stay valid).
//
// Two variants (RefitConfig::kVariant):
// v1: one cooperative launch, one DRAM read of w. The grid is split into groups of CTAS_PER_GROUP
// co-resident CTAs; a group takes experts g, g + groups, ... one at a time: each CTA loads its
// tiles, the group max-reduces |w| through a global atomic, waits at a group barrier (an arrival
// counter), then quantizes. The tile a CTA loaded last is still in registers; others are re-read
// while the expert is hot in L2 (the host sizes groups so that concurrent experts fit in L2).
// v2: two ordinary launches of the same kernel, no inter-CTA waiting: phase 0 streams w once for
// the per-expert amax (a global atomic max per CTA), phase 1 streams w again and quantizes whole
// blocks per thread (quantize_block16), experts in reverse order so that its first reads hit
// what phase 0 left in L2. Moves 2 more bytes per element than v1 (4.56 vs 2.56) but never idles
// DRAM behind a barrier.
// v3: one cooperative launch, chunks of experts software-pipelined two deep (see refit_pipelined_v3):
// one DRAM read of w like v1, the quantize of chunk c - 2 re-reading from L2 while chunk c streams.
// v4 (refit_weights_v4.cuh): one cooperative launch, one DRAM read, tiles waiting for their expert's
// amax in shared memory. v5 (refit_weights_v5.cuh): one ordinary launch, a work queue that
// interleaves the amax stream of the next chunk of experts with the quantize of the previous one.
// v6 (refit_weights_v6.cuh): a shared-memory pipeline per warp. v7 (refit_weights_v7.cuh): v2's two launches,
// the first quantizing with the previous refit's scale as a guess that the second checks. v8 (refit_weights_v8.cuh):
// v7 with the guess checked per warp, no atomics or zeroed workspace, the second launch a programmatic dependent; v9:
// v8 with the verdicts in a launch of their own and the failed experts' tiles shared out over one wave of CTAs.
// refit_weights_kernel.cuh dispatches on the variant.
#pragma once

#include <cuda/atomic>
#include <stdint.h>

#include "trace_kernels/nvfp4.cuh"
#include "trace_kernels/quantize_epilogue.cuh"
#include "trace_kernels/status.cuh"
#include "trace_kernels/vec.cuh"

namespace trace_kernels {

template <typename T_, int CTA_, int KSLOTS_, int VARIANT_ = 1>
struct RefitConfig {
  using T = T_;
  static constexpr int CTA = CTA_;
  static constexpr int kVariant = VARIANT_;
  static_assert(VARIANT_ >= 1 && VARIANT_ <= 11, "variants: 1 .. 11");
  static constexpr int kSlots = KSLOTS_;                   // half blocks per thread per tile (v2: per phase-0 tile)
  static constexpr int kQuantizeBlocks = KSLOTS_ / 2;      // v2 phase 1: whole blocks per thread
  static_assert(VARIANT_ == 1 || KSLOTS_ % 2 == 0, "v2/v3 quantize whole blocks (pairs of half blocks)");
  static constexpr int kTileHalfBlocks = CTA * KSLOTS_;    // half blocks per CTA tile
  static constexpr int kTileElems = kTileHalfBlocks * 8;   // v4: elements per shared-memory tile
  static_assert(CTA % 64 == 0, "whole warps, even lanes pair into blocks");
};

// kL2Hint: load with the given L2 eviction policy (vec.cuh l2_policy_*), else plain __ldg.
template <class Cfg, bool kL2Hint = false>
__device__ __forceinline__ void load_tile(const typename Cfg::T* __restrict__ w, int64_t tile, int64_t half_blocks,
                                          Vec8<typename Cfg::T> (&v)[Cfg::kSlots], uint64_t l2_policy = 0) {
#pragma unroll
  for (int k = 0; k < Cfg::kSlots; ++k) {
    const int64_t h = tile * Cfg::kTileHalfBlocks + k * Cfg::CTA + threadIdx.x;
    if (h >= half_blocks) v[k].zero();
    else if constexpr (kL2Hint) v[k].load(w + h * 8, l2_policy);
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

// One CTA's part of expert e's amax into workspace[2 e] (|w| bits order like the floats, and NaN
// bits win the max: detection for free), then one arrival on workspace[2 e + 1], released after it.
__device__ __forceinline__ void publish_expert_amax(uint32_t* workspace, int e, float amax) {
  cuda::atomic_ref<uint32_t, cuda::thread_scope_device> amax_bits(workspace[2 * e]);
  cuda::atomic_ref<uint32_t, cuda::thread_scope_device> arrived(workspace[2 * e + 1]);
  amax_bits.fetch_max(__float_as_uint(amax) & 0x7fffffffu, cuda::memory_order_relaxed);
  arrived.fetch_add(1u, cuda::memory_order_release);
}

// Waits until an arrival count reaches target (acquire). Bounded: after ~2 s it traps (a launch
// error instead of a hang), which only broken co-residency or claim order could cause.
__device__ __forceinline__ void wait_for_arrivals(uint32_t& count, uint32_t target) {
  cuda::atomic_ref<uint32_t, cuda::thread_scope_device> arrived(count);
  uint32_t spins = 0;
  while (arrived.load(cuda::memory_order_acquire) < target) {
    __nanosleep(128);
    if (++spins > (1u << 24)) __trap();
  }
}

// Expert e's finished amax (after wait_for_arrivals on its count).
__device__ __forceinline__ float expert_amax_of(uint32_t* workspace, int e) {
  cuda::atomic_ref<uint32_t, cuda::thread_scope_device> amax_bits(workspace[2 * e]);
  return __uint_as_float(amax_bits.load(cuda::memory_order_relaxed));
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
    amax = cta_amax<Cfg>(amax, warp_amax);
    if (threadIdx.x == 0) {
      publish_expert_amax(workspace, e, amax);
      wait_for_arrivals(workspace[2 * e + 1], static_cast<uint32_t>(ctas_per_group));
      expert_amax_shared = expert_amax_of(workspace, e);
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

// From the scale itself (refit v7's guess); finite exactly when the amax it came from is.
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
template <class Cfg, bool kL2Hint = false>
__device__ __forceinline__ void refit_quantize_tile(const typename Cfg::T* __restrict__ w, uint8_t* __restrict__ codes,
                                                    uint8_t* __restrict__ block_scales, float* __restrict__ scales,
                                                    float expert_amax, int e, int64_t tile, int64_t per_expert,
                                                    int k_dim, uint32_t* __restrict__ status, uint64_t l2_policy = 0) {
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
      if constexpr (kL2Hint) {
        v[k][0].load(we + b * 16, l2_policy);
        v[k][1].load(we + b * 16 + 8, l2_policy);
      } else {
        v[k][0].load(we + b * 16);
        v[k][1].load(we + b * 16 + 8);
      }
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

// v3: one cooperative launch (every CTA co-resident), experts in chunks of chunk_experts, software
// pipelined two chunks deep with no grid-wide barrier: step c streams chunk c from DRAM for its
// amax (warp atomic max per tile), counts this CTA's arrival on chunk c, then quantizes chunk c - 2,
// re-read from L2, after waiting until every CTA has arrived on it (by then they almost always
// have: they are a whole step ahead of needing it). DRAM traffic ~2.56 B/element when the three
// chunks in flight fit in L2 (the host sizes chunks at ~L2 / 5). workspace: [2 e] amax bits of expert e,
// [2 c + 1] arrivals on chunk c; zeroed by the host. Waits are bounded: a CTA that waits ~2 s
// traps (a launch error instead of a hang), which only a broken co-residency could cause.
template <class Cfg>
__device__ __forceinline__ void refit_pipelined_v3(const typename Cfg::T* __restrict__ w, uint8_t* __restrict__ codes,
                                                   uint8_t* __restrict__ block_scales, float* __restrict__ scales,
                                                   uint32_t* __restrict__ workspace, int experts, int64_t per_expert,
                                                   int k_dim, int chunk_experts, uint32_t* __restrict__ status) {
  using cuda::memory_order_release;
  constexpr int kLag = 2;  // quantize chunk c - kLag while streaming chunk c
  const int64_t tiles_per_expert = (per_expert / 8 + Cfg::kTileHalfBlocks - 1) / Cfg::kTileHalfBlocks;
  const int chunks = (experts + chunk_experts - 1) / chunk_experts;
  const uint32_t ctas = gridDim.x;
  // the amax read keeps its lines in L2 for the quantize re-read two steps later, which is their last
  const uint64_t keep = l2_policy_evict_last(), last_use = l2_policy_evict_first();
  Vec8<typename Cfg::T> v[Cfg::kSlots];

  for (int c = 0; c < chunks + kLag; ++c) {
    if (c < chunks) {  // amax of chunk c
      const int e0 = c * chunk_experts;
      const int64_t tiles = static_cast<int64_t>(min(chunk_experts, experts - e0)) * tiles_per_expert;
      for (int64_t t = blockIdx.x; t < tiles; t += ctas) {
        const int e = e0 + static_cast<int>(t / tiles_per_expert);
        load_tile<Cfg, true>(w + static_cast<int64_t>(e) * per_expert, t % tiles_per_expert, per_expert / 8, v, keep);
        float amax = 0.f;
#pragma unroll
        for (int k = 0; k < Cfg::kSlots; ++k) amax = nvfp4::fmax_nan(amax, v[k].abs_max());
        amax = warp_amax_nan(amax);
        if (threadIdx.x % 32 == 0) atomicMax(workspace + 2 * e, __float_as_uint(amax) & 0x7fffffffu);
      }
      __syncthreads();  // this CTA's atomics for chunk c precede its arrival
      if (threadIdx.x == 0) {
        __threadfence();
        cuda::atomic_ref<uint32_t, cuda::thread_scope_device> arrived(workspace[2 * c + 1]);
        arrived.fetch_add(1u, memory_order_release);
      }
    }
    const int q = c - kLag;
    if (q >= 0) {  // quantize chunk q = c - kLag once every CTA has contributed its amax
      if (threadIdx.x == 0) wait_for_arrivals(workspace[2 * q + 1], ctas);
      __syncthreads();
      const int e0 = q * chunk_experts;
      const int64_t tiles = static_cast<int64_t>(min(chunk_experts, experts - e0)) * tiles_per_expert;
      for (int64_t t = blockIdx.x; t < tiles; t += ctas) {
        const int e = e0 + static_cast<int>(t / tiles_per_expert);
        const float expert_amax = __uint_as_float(__ldcg(workspace + 2 * e));
        refit_quantize_tile<Cfg, true>(w, codes, block_scales, scales, expert_amax, e, t % tiles_per_expert,
                                       per_expert, k_dim, status, last_use);
      }
    }
  }
}

}  // namespace trace_kernels
