// refit_weights v4 (see refit_weights.cuh for the op and v1..v3): one DRAM read of w, with the data
// waiting for its expert's amax in shared memory instead of L2 or registers.
//
// Each expert is cut into tiles of Cfg::kTileElems elements (the last one partial); the tiles of all
// experts in expert order form one sequence, and CTA c of the cooperative grid (G CTAs, all
// co-resident) takes tiles c, c + G, ... (its local steps j = 0, 1, ...). Each tile arrives by bulk
// copy (TMA) into a ring of `stages` shared-memory buffers. Step j:
//   1. wait for tile j, max-reduce its |w| into its expert's amax (one global atomic per tile), then
//      count the tile as arrived on its expert (release);
//   2. quantize tile j - lag from its buffer once every tile of its expert has arrived (acquire; the
//      host picks lag = ceil(tiles per expert / G) + 1 steps, by which time CTAs that keep pace have
//      all passed that expert's last tile, so the wait is almost always already over);
//   3. refill the freed buffer with tile j - lag + stages (stages = lag + 1 + prefetch).
// Dependencies only point to earlier steps of any CTA, so co-resident CTAs cannot deadlock; a CTA
// that waits ~2 s traps (a launch error instead of a hang), which only broken co-residency could cause.
// workspace: [2 e] amax bits of expert e, [2 e + 1] tiles of expert e arrived; zeroed by the host.
// Shared memory (dynamic): stages tile buffers, then stages mbarriers.
#pragma once

#include <cuda/atomic>

#include "trace_kernels/bulk_copy.cuh"
#include "trace_kernels/refit_weights.cuh"

namespace trace_kernels {

// |w| amax of this thread's blocks of a tile in shared memory (NaN wins), reduced over the CTA; every
// thread gets it. kBlocks = Cfg::kQuantizeBlocks blocks per thread, block b = threadIdx + k * CTA.
template <class Cfg>
__device__ __forceinline__ float refit_tile_amax_v4(const typename Cfg::T* tile, int blocks, float* warp_amax) {
  float amax = 0.f;
#pragma unroll
  for (int k = 0; k < Cfg::kQuantizeBlocks; ++k) {
    const int b = threadIdx.x + k * Cfg::CTA;
    if (b >= blocks) continue;
    Vec8<typename Cfg::T> lo, hi;
    lo.load_shared(tile + b * 16);
    hi.load_shared(tile + b * 16 + 8);
    amax = nvfp4::fmax_nan(amax, nvfp4::fmax_nan(lo.abs_max(), hi.abs_max()));
  }
  amax = cta_amax<Cfg>(amax, warp_amax);
  __syncthreads();  // warp_amax is rewritten by the next tile
  return amax;
}

// Quantize this thread's blocks of tile `tile_in_expert` of expert e from shared memory with the
// expert's finished amax (refit_quantize_tile's arithmetic and outputs, read from shared memory).
template <class Cfg>
__device__ __forceinline__ void refit_quantize_tile_v4(const typename Cfg::T* tile, int blocks, float expert_amax, int e,
                                                       int64_t tile_in_expert, int64_t per_expert, int k_dim,
                                                       uint8_t* __restrict__ codes, uint8_t* __restrict__ block_scales,
                                                       float* __restrict__ scales, uint32_t* __restrict__ status) {
  using T = typename Cfg::T;
  const bool finite = nvfp4::is_finite(expert_amax);
  const float s = __fdiv_rn(expert_amax, nvfp4::kGlobalDivisor);
  const float six_s = nvfp4::kFp4Max * s;
  if (finite && tile_in_expert == 0 && threadIdx.x == 0) scales[e] = s;
  const int64_t first_block = static_cast<int64_t>(e) * (per_expert / 16) + tile_in_expert * (Cfg::kTileElems / 16);
#pragma unroll
  for (int k = 0; k < Cfg::kQuantizeBlocks; ++k) {
    const int b = threadIdx.x + k * Cfg::CTA;
    if (b >= blocks) continue;
    Vec8<T> lo, hi;
    lo.load_shared(tile + b * 16);
    hi.load_shared(tile + b * 16 + 8);
    const int64_t bg = first_block + b;  // global block index
    if (!finite) {  // leave the previous weights in place; report where the bad values are
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const Vec8<T>& v = half ? hi : lo;
        if (nvfp4::is_finite(v.abs_max())) continue;
        float f[8];
        v.to_float(f);
        const int64_t flat = (bg - static_cast<int64_t>(e) * (per_expert / 16)) * 16 + half * 8;  // in the expert
        const uint64_t row = static_cast<uint64_t>(e) * (per_expert / k_dim) + flat / k_dim;
        report_nonfinite(status, kStatusRefitWeights, row, static_cast<uint32_t>(flat % k_dim), f);
      }
      continue;
    }
    const nvfp4::BlockStep step = nvfp4::block_step(nvfp4::fmax_nan(lo.abs_max(), hi.abs_max()), s, six_s);
    uint4 unused_lo, unused_hi;
    reinterpret_cast<uint2*>(codes)[bg] = quantize_block16<T>(lo, hi, step, false, unused_lo, unused_hi);
    block_scales[bg] = step.scale_bits;
  }
}

template <class Cfg>
__device__ __forceinline__ void refit_smem_pipelined_v4(const typename Cfg::T* __restrict__ w,
                                                        uint8_t* __restrict__ codes,
                                                        uint8_t* __restrict__ block_scales, float* __restrict__ scales,
                                                        uint32_t* __restrict__ workspace, int experts,
                                                        int64_t per_expert, int k_dim, int lag, int stages,
                                                        uint32_t* __restrict__ status) {
  using T = typename Cfg::T;
  extern __shared__ __align__(128) unsigned char smem[];
  T* ring = reinterpret_cast<T*>(smem);                                                    // [stages][kTileElems]
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + stages * Cfg::kTileElems * sizeof(T));  // [stages]
  __shared__ float warp_amax[Cfg::CTA / 32];
  __shared__ float expert_amax_shared;

  const int64_t tiles_per_expert = (per_expert + Cfg::kTileElems - 1) / Cfg::kTileElems;
  const int64_t tiles = tiles_per_expert * experts;
  const int64_t ctas = gridDim.x;
  const int64_t steps = tiles > blockIdx.x ? (tiles - 1 - blockIdx.x) / ctas + 1 : 0;  // this CTA's tiles
  auto tile_of = [&](int64_t step) { return blockIdx.x + step * ctas; };                  // global tile index
  auto tile_elems = [&](int64_t t) {
    const int64_t left = per_expert - (t % tiles_per_expert) * Cfg::kTileElems;
    return static_cast<int>(left < Cfg::kTileElems ? left : Cfg::kTileElems);
  };
  auto fetch = [&](int64_t step) {  // thread 0 only
    if (step >= steps) return;
    const int64_t t = tile_of(step);
    const int stage = static_cast<int>(step % stages);
    const uint32_t bytes = static_cast<uint32_t>(tile_elems(t)) * sizeof(T);
    bulk::mbar_arrive_expect_tx(&full[stage], bytes);
    bulk::bulk_copy(ring + static_cast<int64_t>(stage) * Cfg::kTileElems,
                    w + (t / tiles_per_expert) * per_expert + (t % tiles_per_expert) * Cfg::kTileElems, bytes,
                    &full[stage]);
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) bulk::mbar_init(&full[s], 1);
    bulk::fence_mbar_init();
    for (int s = 0; s < stages; ++s) fetch(s);
  }
  __syncthreads();

  for (int64_t j = 0; j < steps + lag; ++j) {
    if (j < steps) {  // 1. amax of tile j, counted on its expert
      const int64_t t = tile_of(j);
      const int e = static_cast<int>(t / tiles_per_expert);
      const T* buf = ring + static_cast<int64_t>(j % stages) * Cfg::kTileElems;
      bulk::mbar_wait(&full[j % stages], static_cast<uint32_t>(j / stages) & 1u);
      const float amax = refit_tile_amax_v4<Cfg>(buf, tile_elems(t) / 16, warp_amax);
      if (threadIdx.x == 0) publish_expert_amax(workspace, e, amax);
    }
    const int64_t q = j - lag;
    if (q >= 0 && q < steps) {  // 2. quantize tile q once its expert is complete
      const int64_t t = tile_of(q);
      const int e = static_cast<int>(t / tiles_per_expert);
      if (threadIdx.x == 0) {
        wait_for_arrivals(workspace[2 * e + 1], static_cast<uint32_t>(tiles_per_expert));
        expert_amax_shared = expert_amax_of(workspace, e);
      }
      __syncthreads();
      const float expert_amax = expert_amax_shared;
      refit_quantize_tile_v4<Cfg>(ring + static_cast<int64_t>(q % stages) * Cfg::kTileElems, tile_elems(t) / 16,
                                  expert_amax, e, t % tiles_per_expert, per_expert, k_dim, codes, block_scales,
                                  scales, status);
      __syncthreads();  // buffer q % stages read by every thread; expert_amax_shared free
      if (threadIdx.x == 0) fetch(q + stages);  // 3. refill
    }
  }
}

}  // namespace trace_kernels
