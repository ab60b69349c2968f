// Gumbel-max sampling of one token per row (the rollout sampler's plain path: temperature > 0, no
// top-k / top-p), bit-exact with trace_kernels.ops.gumbel_sample.reference on the same device:
//   s[v]    = fl(x[v] * inv_t)                                     (one FP32 rounding, no FMA)
//   u[v]    = the counter hash of (seed, sequence key, position, v) -> (k + 0.5) * 2^-23, k < 2^23
//   token   = argmax_v fl(s[v] + (-logf(-logf(u[v]))))             (torch.argmax: first NaN, else
//                                                                    first maximum)
//   logprob = (s[token] - M) - log(sum_v exp(s[v] - M)), M = max_v s[v] (log_softmax of s; its sum
//             is not torch's order, so it matches the reference to FP32 rounding, not bit for bit)
//
// Grid (rows, splits): a CTA takes one chunk of kChunk consecutive vocab ids of one row, loads it
// into registers (kItems per thread, consecutive lanes on consecutive ids), reduces its max, then
// sums exp(s - max) and draws Gumbel noise only for ids that can still win: every chunk holds a
// value >= fl(max + kGumbelMin), so an id with fl(s + kGumbelMax) below that is skipped (exact:
// FP32 addition is monotone). The last CTA of a row to finish (arrival counter) merges the row's
// partials in split order. splits depends on V only, so a row's result never depends on the batch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

namespace trace_kernels {
namespace gumbel {

// Bounds on -logf(-logf(u)) over every u the hash produces, u in [2^-24, 1 - 2^-24]: the exact
// range is [-2.8115, 16.6355]; the slack covers logf's 1-ulp error many times over.
constexpr float kGumbelMax = 16.75f;
constexpr float kGumbelMin = -2.875f;

// A 32-bit integer finaliser (the same constants as the reference's mix32).
__device__ __forceinline__ uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  return x ^ (x >> 16);
}

// Everything of the hash key but the vocab id, folded once per CTA.
struct RowKey {
  uint32_t position, key_lo, key_hi_seed_lo, seed_hi;
};

__device__ __forceinline__ RowKey row_key(int64_t seq_key, int64_t position, uint32_t seed_lo, uint32_t seed_hi) {
  const uint64_t key = static_cast<uint64_t>(seq_key);
  return {static_cast<uint32_t>(static_cast<uint64_t>(position)), static_cast<uint32_t>(key),
          static_cast<uint32_t>(key >> 32) ^ seed_lo, seed_hi};
}

// U(0, 1) of vocab id v: 23 hash bits, so k + 0.5 and the scaling by 2^-23 are exact in FP32.
__device__ __forceinline__ float uniform(uint32_t v, const RowKey& k) {
  uint32_t h = mix32(v + 0x9E3779B9u);
  h = mix32(h ^ k.position);
  h = mix32(h ^ k.key_lo);
  h = mix32(h ^ k.key_hi_seed_lo);
  h = mix32(h ^ k.seed_hi);
  return __fmul_rn(static_cast<float>(h >> 9) + 0.5f, 0x1p-23f);
}

// IEEE logf (no fast-math in the build flags), the function torch.log calls on CUDA.
__device__ __forceinline__ float gumbel_noise(float u) { return -logf(-logf(u)); }

// torch.argmax's order: a NaN beats every number, then larger wins, ties go to the lower index.
__device__ __forceinline__ bool beats(float a, int ia, float b, int ib) {
  const bool a_nan = isnan(a), b_nan = isnan(b);
  if (a_nan || b_nan) return a_nan && (!b_nan || ia < ib);
  return a > b || (a == b && ia < ib);
}

// One chunk's (or row's) result. best_index is INT32_MAX while nothing was taken.
struct Partial {
  float best;      // fl(s + g) of best_index
  int best_index;  // vocab id
  float max;       // max of s over the chunk (NaN ignored; -inf when empty)
  float sum;       // sum of exp(s - max), 0 for an all -inf chunk
};

__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(float x) { return x; }

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {  // butterfly: a fixed order, deterministic
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ void warp_best(float& v, int& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (beats(ov, oi, v, i)) v = ov, i = oi;
  }
}

}  // namespace gumbel

template <typename T_, int CTA_, int ITEMS_>
struct GumbelSampleConfig {
  using T = T_;
  static constexpr int CTA = CTA_;
  static constexpr int kItems = ITEMS_;  // vocab ids per thread (held in registers)
  static constexpr int kChunk = CTA * ITEMS_;
  static constexpr int kWarps = CTA / 32;
  static_assert(CTA % 32 == 0 && CTA <= 1024, "whole warps");
};

template <class Cfg>
__device__ __forceinline__ void gumbel_max_sample_kernel(
    const typename Cfg::T* __restrict__ logits,  // [rows, vocab]
    const int64_t* __restrict__ seq_keys,        // [rows]
    const int64_t* __restrict__ positions,       // [rows]
    float inv_t, uint32_t seed_lo, uint32_t seed_hi, int vocab, int splits,
    gumbel::Partial* __restrict__ partials,      // [rows, splits] workspace
    unsigned int* __restrict__ arrivals,         // [rows], zero before the launch
    int64_t* __restrict__ tokens,                // [rows]
    float* __restrict__ logprobs) {              // [rows]
  using namespace gumbel;
  __shared__ float red_max[Cfg::kWarps];
  __shared__ float red_sum[Cfg::kWarps];
  __shared__ float red_best[Cfg::kWarps];
  __shared__ int red_index[Cfg::kWarps];
  __shared__ unsigned int arrived_before;

  const int row = blockIdx.x, split = blockIdx.y;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const typename Cfg::T* x = logits + static_cast<int64_t>(row) * vocab;  // [vocab]
  const int first = split * Cfg::kChunk + threadIdx.x;  // this thread's ids: first + k * CTA

  // pass 1: load and scale the chunk, its max (fmaxf ignores NaN)
  float s[Cfg::kItems];
  float m = -INFINITY;
#pragma unroll
  for (int k = 0; k < Cfg::kItems; ++k) {
    const int v = first + k * Cfg::CTA;
    s[k] = v < vocab ? __fmul_rn(to_float(x[v]), inv_t) : -INFINITY;
    m = fmaxf(m, s[k]);
  }
  m = warp_max(m);
  if (lane == 0) red_max[warp] = m;
  __syncthreads();
  m = red_max[0];
#pragma unroll
  for (int w = 1; w < Cfg::kWarps; ++w) m = fmaxf(m, red_max[w]);

  // pass 2: sum of exp(s - m) for the log-prob, noise only where an id can still win
  const RowKey key = row_key(seq_keys[row], positions[row], seed_lo, seed_hi);
  const float chunk_floor = __fadd_rn(m, kGumbelMin);  // the chunk's best is >= this
  const float shift = m == -INFINITY ? 0.f : m;  // an all -inf chunk sums to 0, not NaN
  float sum = 0.f, best = -INFINITY;
  int best_index = INT32_MAX;
#pragma unroll
  for (int k = 0; k < Cfg::kItems; ++k) {
    const int v = first + k * Cfg::CTA;
    if (v >= vocab) continue;
    sum += __expf(s[k] - shift);
    if (__fadd_rn(s[k], kGumbelMax) < chunk_floor) continue;  // cannot win (false for NaN: kept)
    const float candidate = __fadd_rn(s[k], gumbel_noise(uniform(static_cast<uint32_t>(v), key)));
    if (beats(candidate, v, best, best_index)) best = candidate, best_index = v;
  }
  sum = warp_sum(sum);
  warp_best(best, best_index);
  if (lane == 0) red_sum[warp] = sum, red_best[warp] = best, red_index[warp] = best_index;
  __syncthreads();

  if (threadIdx.x == 0) {
    Partial p{red_best[0], red_index[0], m, red_sum[0]};
    for (int w = 1; w < Cfg::kWarps; ++w) {  // warp order: fixed, so the sum is deterministic
      p.sum += red_sum[w];
      if (beats(red_best[w], red_index[w], p.best, p.best_index)) p.best = red_best[w], p.best_index = red_index[w];
    }
    partials[static_cast<int64_t>(row) * splits + split] = p;
    __threadfence();  // the partial is visible device-wide before the arrival is counted
    arrived_before = atomicAdd(arrivals + row, 1u);
  }
  __syncthreads();
  if (arrived_before != static_cast<unsigned int>(splits - 1) || warp != 0) return;

  // The row's last CTA: one warp merges the partials in split order (lane-strided, then butterfly).
  __threadfence();
  const Partial* row_partials = partials + static_cast<int64_t>(row) * splits;
  float row_max = -INFINITY;
  for (int j = lane; j < splits; j += 32) row_max = fmaxf(row_max, __ldcg(&row_partials[j].max));
  row_max = warp_max(row_max);
  float row_sum = 0.f, row_best = -INFINITY;
  int row_index = INT32_MAX;
  for (int j = lane; j < splits; j += 32) {
    const float pm = __ldcg(&row_partials[j].max), ps = __ldcg(&row_partials[j].sum);
    if (pm != -INFINITY) row_sum += ps * __expf(pm - row_max);  // an all -inf chunk adds nothing
    const float pb = __ldcg(&row_partials[j].best);
    const int pi = __ldcg(&row_partials[j].best_index);
    if (beats(pb, pi, row_best, row_index)) row_best = pb, row_index = pi;
  }
  row_sum = warp_sum(row_sum);
  warp_best(row_best, row_index);
  if (lane == 0) {
    const float s_token = __fmul_rn(to_float(x[row_index]), inv_t);
    tokens[row] = row_index;
    logprobs[row] = (s_token - row_max) - logf(row_sum);
  }
}

}  // namespace trace_kernels
