// refit_weights v6 (see refit_weights.cuh for the op and v1..v3): one DRAM read of w, every warp its
// own pipeline, no CTA barrier after the prologue.
//
// Each expert's blocks are cut into one slice per warp of the grid (G CTAs x kWarps warps, all
// co-resident: a cooperative launch); warp u owns the blocks [u * slice, (u + 1) * slice) of every
// expert, so its slices have one size. A warp walks the experts in order through its own ring of
// `stages` shared-memory slots, filled by bulk copies (TMA) that complete on the slot's mbarrier:
//   1. wait for its slice of expert e, max-reduce its |w| over the warp, and publish it: the CTA's
//      last warp on expert e (a shared-memory count) adds the CTA's amax to the expert's global
//      atomic max and counts one CTA arrival (release);
//   2. quantize its slice of expert e - lag from its slot once all G CTAs have arrived on that
//      expert (acquire; the CTA's first warp to see it leaves the amax in shared memory for the
//      others), then refill the slot with its slice of expert e - lag + stages.
// Warps never wait for each other except through those arrivals, which point only to earlier
// experts, so co-resident CTAs cannot deadlock (a wait of ~2 s traps: a launch error, not a hang).
// v4 did the same per CTA with tiles and three CTA barriers each, and 8 warps per SM: it stalled.
// One CTA per SM of Cfg::CTA threads (codegen's V6_THREADS). The first build had 24 warps (768 threads): a
// Qwen3-30B-A3B gate_up slice was then 63 blocks, one pass of two blocks per lane, and the per-expert work
// (amax reduction, publish, ready check, expert scale) was ~45% of a warp's instructions. At 12 warps (384)
// a slice is 125 blocks, two passes, for the same shared memory per stage.
// workspace: [2 e] amax bits of expert e, [2 e + 1] CTAs arrived on expert e; zeroed by the host.
// Dynamic shared memory: kWarps x stages slots of refit_v6_slot_bytes(slice) bytes.
#pragma once

#include <cuda/atomic>

#include "trace_kernels/bulk_copy.cuh"
#include "trace_kernels/refit_weights.cuh"

namespace trace_kernels {

constexpr int kRefitV6MaxStages = 8;
// CTA-level amax slots, indexed by expert modulo this: more than the experts a CTA's warps can be
// apart (a warp at expert e has waited for every warp's arrival on e - 1 - lag).
constexpr int kRefitV6Pending = 16;

// Blocks of 16 elements in one warp's slice of an expert; slots are rounded up to 128 bytes.
__host__ __device__ constexpr int64_t refit_v6_slice_blocks(int64_t blocks, int64_t grid_warps) {
  return (blocks + grid_warps - 1) / grid_warps;
}
__host__ __device__ constexpr int64_t refit_v6_slot_bytes(int64_t slice_blocks, int elem_bytes) {
  return (slice_blocks * 16 * elem_bytes + 127) / 128 * 128;
}

// Lane 0 of each warp: this warp's amax of expert e into the CTA's slot; the CTA's last warp on e
// publishes the CTA's amax and arrival (publish_expert_amax) and frees the slot for expert e + 16.
__device__ __forceinline__ void refit_v6_publish(uint32_t* cta_amax, uint32_t* cta_arrived, uint32_t* workspace, int e,
                                                 float amax, uint32_t warps) {
  using cuda::memory_order_acq_rel;
  using cuda::memory_order_relaxed;
  const int p = e % kRefitV6Pending;
  cuda::atomic_ref<uint32_t, cuda::thread_scope_block> bits(cta_amax[p]);
  cuda::atomic_ref<uint32_t, cuda::thread_scope_block> arrived(cta_arrived[p]);
  bits.fetch_max(__float_as_uint(amax) & 0x7fffffffu, memory_order_relaxed);  // NaN bits win, as in every variant
  if (arrived.fetch_add(1u, memory_order_acq_rel) != warps - 1) return;      // acquire: the other warps' maxima
  const uint32_t cta = bits.exchange(0u, memory_order_relaxed);
  arrived.store(0u, memory_order_relaxed);
  publish_expert_amax(workspace, e, __uint_as_float(cta));
}

// Lane 0 of each warp: expert e's finished amax. The CTA's first warp to need it waits for every CTA's
// arrival and leaves (e, amax bits) in one 64-bit shared word for the CTA's other warps, so a CTA polls
// the arrival count (a global round trip per poll, which stalled every warp once per expert) about once
// per expert. One atomic word: a reader sees the expert and its amax together. Read and written by
// read-modify-writes (ATOMS): compute-sanitizer's racecheck reported the relaxed load and store (plain
// strong LD / ST in SASS) as races, though the memory model orders them.
__device__ __forceinline__ float refit_v6_expert_amax(unsigned long long* ready, uint32_t* workspace, int e,
                                                      uint32_t ctas) {
  cuda::atomic_ref<unsigned long long, cuda::thread_scope_block> word(ready[e % kRefitV6Pending]);
  const unsigned long long seen = word.fetch_or(0ull, cuda::memory_order_relaxed);
  if (static_cast<int>(seen >> 32) == e) return __uint_as_float(static_cast<uint32_t>(seen));
  wait_for_arrivals(workspace[2 * e + 1], ctas);
  const float amax = expert_amax_of(workspace, e);
  word.exchange(static_cast<unsigned long long>(e) << 32 | __float_as_uint(amax), cuda::memory_order_relaxed);
  return amax;
}

// Blocks per lane and pass of the fast slice loop: as many as the registers of one CTA per SM allow (a 384-thread
// CTA may use 168 per thread), so that a lane rounds several independent blocks at once. With 12 warps per SM the
// kernel waited on dependent-instruction latency (Nsight Compute), which more warps cannot hide here: their
// slices would shrink.
__host__ __device__ constexpr int refit_v6_unroll(int cta) { return cta <= 256 ? 6 : cta <= 384 ? 4 : cta <= 512 ? 3 : 2; }

// A warp's slice of expert e (count blocks from its slot: the expert's blocks first .. first + count - 1) on the
// branch-free path, kUnroll blocks per lane and pass. Lanes past the slice round a copy of its last block and
// store nothing, so the blocks of a pass have no branch between them and their instructions interleave.
template <typename T, int kUnroll>
__device__ __forceinline__ void refit_v6_round_slice_fast(const T* slot, int count, int lane, const RefitExpertScale& scale,
                                                          int e, int64_t first, int64_t per_expert,
                                                          uint8_t* __restrict__ codes,
                                                          uint8_t* __restrict__ block_scales) {
  const int64_t base = static_cast<int64_t>(e) * (per_expert / 16) + first;  // global index of the slice's block 0
  for (int i0 = lane; i0 < count; i0 += 32 * kUnroll) {
    Vec8<T> v[kUnroll][2];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = min(i0 + 32 * u, count - 1);
      v[u][0].load_shared(slot + i * 16);
      v[u][1].load_shared(slot + i * 16 + 8);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const nvfp4::BlockStep step = block_step_fast(block16_abs_max<T>(v[u][0], v[u][1]), scale.s, scale.six_s_div);
      uint4 unused_lo, unused_hi;
      const uint2 q = quantize_block16_fast<T, false>(v[u][0], v[u][1], step, unused_lo, unused_hi);
      const int i = i0 + 32 * u;
      if (i < count) {
        reinterpret_cast<uint2*>(codes)[base + i] = q;
        block_scales[base + i] = step.scale_bits;
      }
    }
  }
}

// The same slice through refit_quantize_block: a non-finite expert (reports its bad values) or a scale off the fast
// range. Two blocks per lane and pass.
template <typename T>
__device__ __forceinline__ void refit_v6_round_slice(const T* slot, int count, int lane, const RefitExpertScale& scale,
                                                     int e, int64_t first, int64_t per_expert, int k_dim,
                                                     uint8_t* __restrict__ codes, uint8_t* __restrict__ block_scales,
                                                     uint32_t* __restrict__ status) {
  for (int i = lane; i < count; i += 64) {
    const int j = i + 32;
    Vec8<T> v[2][2];
    v[0][0].load_shared(slot + i * 16);
    v[0][1].load_shared(slot + i * 16 + 8);
    if (j < count) {
      v[1][0].load_shared(slot + j * 16);
      v[1][1].load_shared(slot + j * 16 + 8);
    }
    refit_quantize_block<T>(v[0][0], v[0][1], scale, e, first + i, per_expert, k_dim, codes, block_scales, status);
    if (j < count)
      refit_quantize_block<T>(v[1][0], v[1][1], scale, e, first + j, per_expert, k_dim, codes, block_scales, status);
  }
}

template <class Cfg>
__device__ __forceinline__ void refit_warp_pipelined_v6(const typename Cfg::T* __restrict__ w,
                                                        uint8_t* __restrict__ codes,
                                                        uint8_t* __restrict__ block_scales, float* __restrict__ scales,
                                                        uint32_t* __restrict__ workspace, int experts,
                                                        int64_t per_expert, int k_dim, int stages, int lag,
                                                        uint32_t* __restrict__ status) {
  using T = typename Cfg::T;
  constexpr int kWarps = Cfg::CTA / 32;
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ uint64_t full[kWarps][kRefitV6MaxStages];
  __shared__ uint32_t cta_amax[kRefitV6Pending], cta_arrived[kRefitV6Pending];
  __shared__ unsigned long long ready[kRefitV6Pending];  // (expert << 32) | its finished amax bits; ~0 at first

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t blocks = per_expert / 16;
  const int64_t slice = refit_v6_slice_blocks(blocks, static_cast<int64_t>(gridDim.x) * kWarps);
  const int64_t slot_elems = refit_v6_slot_bytes(slice, sizeof(T)) / sizeof(T);
  T* ring = reinterpret_cast<T*>(smem) + static_cast<int64_t>(warp) * stages * slot_elems;  // [stages][slot_elems]
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * slice;  // first block in each expert
  const int count = static_cast<int>(max(int64_t{0}, min(slice, blocks - first)));     // blocks per slice, maybe 0
  const uint32_t bytes = static_cast<uint32_t>(count) * 16 * sizeof(T);

  if (threadIdx.x < kRefitV6Pending) {
    cta_amax[threadIdx.x] = cta_arrived[threadIdx.x] = 0u;
    ready[threadIdx.x] = ~0ull;  // expert -1
  }
  if (lane == 0) {
    for (int s = 0; s < stages; ++s) bulk::mbar_init(&full[warp][s], 1);
    bulk::fence_mbar_init();
  }
  __syncthreads();
  auto fetch = [&](int e) {  // lane 0: this warp's slice of expert e into slot e % stages
    if (e >= experts || count == 0) return;
    const int s = e % stages;
    bulk::mbar_arrive_expect_tx(&full[warp][s], bytes);
    bulk::bulk_copy(ring + s * slot_elems, w + static_cast<int64_t>(e) * per_expert + first * 16, bytes, &full[warp][s]);
  };
  if (lane == 0)
    for (int e = 0; e < stages; ++e) fetch(e);

  for (int e = 0; e < experts + lag; ++e) {
    if (e < experts) {  // 1. amax of this warp's slice of expert e, published through the CTA
      float amax = 0.f;
      if (count > 0) {
        bulk::mbar_wait(&full[warp][e % stages], static_cast<uint32_t>(e / stages) & 1u);
        const T* slot = ring + (e % stages) * slot_elems;
        for (int h0 = lane; h0 < 2 * count; h0 += 4 * 32) {  // half blocks: consecutive lanes, consecutive 16 bytes
          Vec8<T> v[4];  // four loads in flight before the first use
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            if (h0 + 32 * u < 2 * count) v[u].load_shared(slot + (h0 + 32 * u) * 8);
            else v[u].zero();
          }
#pragma unroll
          for (int u = 0; u < 4; ++u) amax = nvfp4::fmax_nan(amax, v[u].abs_max());
        }
      }
      amax = warp_amax_nan(amax);
      if (lane == 0) refit_v6_publish(cta_amax, cta_arrived, workspace, e, amax, kWarps);
    }
    const int q = e - lag;
    if (q < 0) continue;
    // 2. quantize the slice of expert q once every CTA has published its amax
    float expert_amax = 0.f;
    if (lane == 0) expert_amax = refit_v6_expert_amax(ready, workspace, q, gridDim.x);
    expert_amax = __shfl_sync(0xffffffffu, expert_amax, 0);
    const RefitExpertScale scale = refit_expert_scale(expert_amax);
    if (scale.finite && first == 0 && lane == 0) scales[q] = scale.s;
    const T* slot = ring + (q % stages) * slot_elems;
    if (scale.finite && scale.fast) {  // the usual expert: every block on the branch-free path
      refit_v6_round_slice_fast<T, refit_v6_unroll(Cfg::CTA)>(slot, count, lane, scale, q, first, per_expert, codes,
                                                              block_scales);
    } else {
      refit_v6_round_slice<T>(slot, count, lane, scale, q, first, per_expert, k_dim, codes, block_scales, status);
    }
    __syncwarp();  // every lane is done with the slot before it is refilled
    if (lane == 0) fetch(q + stages);
  }
}

}  // namespace trace_kernels
