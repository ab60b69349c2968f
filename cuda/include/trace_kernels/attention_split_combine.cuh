// decode_attention_combine: merges a split-KV decode's partial outputs, o [B*Hq, S, D] f32 and lse [B*Hq, S] (log2
// domain), into out [B*Hq, D] bf16 = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M); one CTA per (sequence, q head),
// launched after the decode kernel. (A merge inside the decode kernel's last CTAs, which saved this launch, measured
// 1-4% slower on the H100 and was removed on 2026-12-05: docs/kv_cache.md.)
#pragma once

#include <cuda_bf16.h>
#include <math_constants.h>
#include <stdint.h>

#include <type_traits>

#include "trace_kernels/cta_timeline.cuh"
#include "trace_kernels/pdl.cuh"

namespace trace_kernels {

// decode_attention_combine: warp w takes splits w, w + kWarps, ... (lane i: elements i * D/32 ..), so each warp has
// several whole split rows in flight instead of one thread per element walking every split in turn (7.2 us for
// 4 MB of partials at B = 8, Hq = 32, 32 splits, H200); the warps' sums are added in warp order (deterministic).
// Launched as a programmatic dependent of the decode kernel: it waits for that grid before its first read.
template <int D, int kWarps>
__device__ __forceinline__ void decode_attention_combine(const float* __restrict__ o_part,    // [B*Hq, S, D]
                                                         const float* __restrict__ lse_part,  // [B*Hq, S]
                                                         __nv_bfloat16* __restrict__ out,     // [B*Hq, D]
                                                         int num_splits) {
  static_assert(D % 64 == 0, "a lane takes D / 32 elements as one 8- or 16-byte load");
  constexpr int kVec = D / 32;
  using Vec = typename std::conditional<kVec == 4, float4, float2>::type;
  __shared__ float partial_num[kWarps][D];
  __shared__ float partial_den[kWarps];
  CTA_STAMP(0);  // diagnostic timeline (cta_timeline.cuh): empty unless TRACE_KERNELS_CTA_TIMELINE
  pdl::wait_for_prerequisite_grid();
  CTA_STAMP(1);
  const int64_t bh = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* lse = lse_part + bh * num_splits;
  float m = -CUDART_INF_F;
  for (int s = lane; s < num_splits; s += 32) m = fmaxf(m, lse[s]);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  float num[kVec] = {}, den = 0.f;
#pragma unroll 4
  for (int s = warp; s < num_splits; s += kWarps) {
    const float l = lse[s];
    const float w = l == -CUDART_INF_F ? 0.f : exp2f(l - m);
    const Vec v = *reinterpret_cast<const Vec*>(o_part + (bh * num_splits + s) * D + lane * kVec);
    const float* x = reinterpret_cast<const float*>(&v);
    den += w;
#pragma unroll
    for (int j = 0; j < kVec; ++j) num[j] = fmaf(w, x[j], num[j]);
  }
#pragma unroll
  for (int j = 0; j < kVec; ++j) partial_num[warp][lane * kVec + j] = num[j];
  if (lane == 0) partial_den[warp] = den;
  __syncthreads();
  for (int d = threadIdx.x; d < D; d += kWarps * 32) {
    float n = 0.f, l = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      n += partial_num[w][d];
      l += partial_den[w];
    }
    out[bh * D + d] = __float2bfloat16_rn(l > 0.f ? n / l : 0.f);
  }
  CTA_STAMP(5);
}

}  // namespace trace_kernels
