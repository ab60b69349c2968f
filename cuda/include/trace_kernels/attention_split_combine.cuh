// Merging a split-KV decode's partial outputs, o [B*Hq, S, D] f32 and lse [B*Hq, S] (log2 domain), into
// out [B*Hq, D] bf16 = sum_s 2^(lse_s - M) o_s / sum_s 2^(lse_s - M), in one of two places:
//   - decode_attention_combine: a kernel launched after the decode, one CTA per (sequence, q head);
//   - combine_splits_in_kernel: the decode kernel's own last CTAs (attention.FUSED_SPLIT_COMBINE), which saves the
//     combine launch and the wait for it (4-9 us per call in a CUDA graph on the H200, docs/kv_cache.md).
// Both compute every output element with the same FP32 operations in the same order: kCombineWarps interleaved
// partial sums (sum v: splits v, v + kCombineWarps, ... in turn, fmaf), added in order v = 0, 1, ... So their
// outputs are equal bit for bit (tests/gpu/test_kv_kernels.py checks it), and a launch may take either.
#pragma once

#include <cuda_bf16.h>
#include <math_constants.h>
#include <stdint.h>

#include <cuda/atomic>
#include <type_traits>

#include "trace_kernels/attention_decode_params.cuh"
#include "trace_kernels/decode_timeline.cuh"
#include "trace_kernels/pdl.cuh"

namespace trace_kernels {

// The interleave of the partial sums (codegen.ops.decode_attention.COMBINE_THREADS = 32 x this).
constexpr int kCombineWarps = 8;

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
  static_assert(kWarps == kCombineWarps, "combine_splits_in_kernel sums in this interleave");
  constexpr int kVec = D / 32;
  using Vec = typename std::conditional<kVec == 4, float4, float2>::type;
  __shared__ float partial_num[kWarps][D];
  __shared__ float partial_den[kWarps];
  DECODE_STAMP(0);  // diagnostic timeline (decode_timeline.cuh): empty unless TRACE_KERNELS_DECODE_TIMELINE
  pdl::wait_for_prerequisite_grid();
  DECODE_STAMP(1);
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
  DECODE_STAMP(5);
}

namespace split_combine {

// Floats of shared memory one row takes in combine_splits_in_kernel: the interleaved sums [kCombineWarps][D], their
// weights [kCombineWarps] and the row's maximum.
template <int D>
constexpr int kRowFloats = kCombineWarps * D + kCombineWarps + 1;

// The combiner this CTA is after its arrival (ticket = arrivals before it), or -1: the last `ctas` arrivals of a
// cell combine, combiner j = the (j + 1)-th of those.
__host__ __device__ __forceinline__ int combiner_of_ticket(int ticket, int splits, int ctas) {
  const int j = ticket - (splits - ctas);
  return j >= 0 ? j : -1;
}

// Rows [0, rows) of a cell go to its combiners round robin: combiner j takes rows j, j + ctas, ...
__host__ __device__ __forceinline__ int rows_of_combiner(int rows, int ctas, int j) { return (rows - j + ctas - 1) / ctas; }

// Waits (acquire) until count reaches target, polling at most every ~256 ns (the counters of 8 cells share an L2
// sector, which the tail CTAs' streaming also needs). Bounded: after ~4 s it traps, a launch error instead of a hang,
// which only a launch whose CTAs are not all resident at once could cause (attention.py launches one wave only).
__device__ __forceinline__ void wait_for_arrivals(int& count, int target) {
  cuda::atomic_ref<int, cuda::thread_scope_device> arrived(count);
  uint32_t spins = 0, sleep_ns = 32;
  while (arrived.load(cuda::memory_order_acquire) < target) {
    __nanosleep(sleep_ns);
    sleep_ns = sleep_ns < 256 ? 2 * sleep_ns : sleep_ns;
    if (++spins > (1u << 24)) __trap();
  }
}

}  // namespace split_combine

// After a decode CTA has stored its split's partial outputs (o_part, lse_part) for its `rows` q heads
// (row_head(r): the head of row r), merge them if p.combine_counters is set and this CTA is among the last
// p.combine_ctas (W) of its cell to finish. A cell is every CTA with this blockIdx.x and sequence b, one per split:
// they store the same rows. The arrivals are counted in combine_counters[cell]; the first S - W CTAs leave, the last W
// wait until all S have arrived and then each merges its share of the rows (rows j, j + W, ...). The last of the W
// to leave (combine_counters[cells + cell]) sets both counters back to zero for the next launch.
// The W - 1 waits end only if every CTA of the launch can be resident at once, so the launcher sets the counters for
// one-wave launches only. smem: at least kRowFloats<D> floats, free for reuse (the stages, after the tile loop).
template <int D, int kThreads, int kSmemFloats, class RowHead>
__device__ __forceinline__ void combine_splits_in_kernel(const DecodeParams& p, int b, int hq, int rows,
                                                         RowHead row_head, float* smem) {
  constexpr int kChunks = D / 4;  // float4 chunks of a row
  constexpr int kRowFloats = split_combine::kRowFloats<D>;
  constexpr int kPassRows = kSmemFloats / kRowFloats;
  static_assert(kPassRows >= 1, "shared memory for one row's interleaved sums");
  static_assert(D % 4 == 0 && kThreads % 32 == 0, "float4 chunks, whole warps");
  __shared__ int role;
  const int num_splits = gridDim.y;
  if (p.combine_counters == nullptr || num_splits == 1) return;
  const int ctas = max(1, min(p.combine_ctas, num_splits));
  const int cells = gridDim.x * gridDim.z;
  const int cell = b * gridDim.x + blockIdx.x;
  __threadfence();  // this thread's partial outputs, visible device-wide before the CTA's arrival below
  __syncthreads();
  if (threadIdx.x == 0) {
    const int ticket = atomicAdd(p.combine_counters + cell, 1);
    const int j = split_combine::combiner_of_ticket(ticket, num_splits, ctas);
    if (j >= 0) split_combine::wait_for_arrivals(p.combine_counters[cell], num_splits);
    role = j;
  }
  __syncthreads();
  const int j = role;
  if (j < 0) return;
  __threadfence();  // the other CTAs' partial outputs: complete before their arrivals were counted

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int my_rows = split_combine::rows_of_combiner(rows, ctas, j);
  for (int r0 = 0; r0 < my_rows; r0 += kPassRows) {
    const int n = min(kPassRows, my_rows - r0);
    float* num = smem;                                 // [n][kCombineWarps][D]
    float* den = smem + n * kCombineWarps * D;         // [n][kCombineWarps]
    float* row_max = den + n * kCombineWarps;          // [n]
    auto row_bh = [&](int rl) { return static_cast<int64_t>(b) * hq + row_head(j + ctas * (r0 + rl)); };
    // The rows' maxima: a warp per row, lanes across the splits (the other CTAs' stores: __ldcg, past L1).
    for (int rl = warp; rl < n; rl += kThreads / 32) {
      const float* lse = p.lse_part + row_bh(rl) * num_splits;
      float m = -CUDART_INF_F;
      for (int s = lane; s < num_splits; s += 32) m = fmaxf(m, __ldcg(lse + s));
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
      if (lane == 0) row_max[rl] = m;
    }
    __syncthreads();
    // Interleaved sum v of (row, chunk) over splits v, v + kCombineWarps, ...: decode_attention_combine's warp v.
    for (int item = threadIdx.x; item < n * kCombineWarps * kChunks; item += kThreads) {
      const int c = item % kChunks;
      const int v = (item / kChunks) % kCombineWarps;
      const int rl = item / (kChunks * kCombineWarps);
      const int64_t bh = row_bh(rl);
      const float m = row_max[rl];
      const float* lse = p.lse_part + bh * num_splits;
      float acc[4] = {0.f, 0.f, 0.f, 0.f}, weights = 0.f;
#pragma unroll 4
      for (int s = v; s < num_splits; s += kCombineWarps) {
        const float l = __ldcg(lse + s);
        const float w = l == -CUDART_INF_F ? 0.f : exp2f(l - m);
        const float4 x = __ldcg(reinterpret_cast<const float4*>(p.o_part + (bh * num_splits + s) * D) + c);
        weights += w;
        acc[0] = fmaf(w, x.x, acc[0]);
        acc[1] = fmaf(w, x.y, acc[1]);
        acc[2] = fmaf(w, x.z, acc[2]);
        acc[3] = fmaf(w, x.w, acc[3]);
      }
      *reinterpret_cast<float4*>(num + (rl * kCombineWarps + v) * D + 4 * c) = make_float4(acc[0], acc[1], acc[2], acc[3]);
      if (c == 0) den[rl * kCombineWarps + v] = weights;
    }
    __syncthreads();
    // The sums added in order v = 0, 1, ...: decode_attention_combine's warp order.
    for (int item = threadIdx.x; item < n * kChunks; item += kThreads) {
      const int c = item % kChunks;
      const int rl = item / kChunks;
      float o[4] = {0.f, 0.f, 0.f, 0.f}, l = 0.f;
#pragma unroll
      for (int v = 0; v < kCombineWarps; ++v) {
        const float4 x = *reinterpret_cast<const float4*>(num + (rl * kCombineWarps + v) * D + 4 * c);
        o[0] += x.x;
        o[1] += x.y;
        o[2] += x.z;
        o[3] += x.w;
        l += den[rl * kCombineWarps + v];
      }
      const __nv_bfloat162 lo = __floats2bfloat162_rn(l > 0.f ? o[0] / l : 0.f, l > 0.f ? o[1] / l : 0.f);
      const __nv_bfloat162 hi = __floats2bfloat162_rn(l > 0.f ? o[2] / l : 0.f, l > 0.f ? o[3] / l : 0.f);
      *reinterpret_cast<uint2*>(p.out + row_bh(rl) * D + 4 * c) =
          make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
    }
    __syncthreads();  // smem is rewritten by the next pass
  }
  if (threadIdx.x == 0 && atomicAdd(p.combine_counters + cells + cell, 1) == ctas - 1) {
    p.combine_counters[cell] = 0;  // every combiner is past its wait: ready for the next launch
    p.combine_counters[cells + cell] = 0;
  }
  DECODE_COMBINED(j);
}

}  // namespace trace_kernels
