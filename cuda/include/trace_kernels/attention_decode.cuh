// Split-KV (flash-decoding) paged decode attention over NVFP4 or BF16 KV pages, GQA-aware.
//
//   q [B, Hq, D] bf16, pages (docs/kv_cache.md), block_table int32 [B, max_pages], lengths int32 [B]
//   -> out [B, Hq, D] bf16 (one split), or per-split partials o [B, Hq, S, D] f32 + lse [B, Hq, S]
//      (log2 domain) that attention_split_combine.cuh merges.
//
// One CTA = (kv head, head group, split, sequence) and owns G <= 8 q heads of that kv head, so
// every K/V byte of a split is read once for all of them (q heads of one kv head beyond 8 go to a
// sibling CTA with the next blockIdx.x, which reads the same pages mostly from L2).
//
// Per tile of TT tokens: cp.async (16-byte chunks, zero-filled past the sequence end) stages the
// pages of the tile in shared memory, STAGES deep. Then (1) scores: a row group of L = D/8 lanes
// owns one token, each lane 8 elements of D and all G q rows in registers; the G partial dots are
// reduced across the row group by a transposed butterfly (log2 L shuffle rounds, G/2, G/4, ...
// values each), so each lane ends with one head's score; (2) FP32 online softmax (running max,
// exp2 with the log2(e) folded into q) per head; (3) P.V with the same lane layout, FP32
// accumulators [G][8] per lane.
//
// NVFP4 dequantization is exact: an E2M1 nibble is rewritten as the E4M3 byte with the same bits
// in place (value / 64), converted by the hardware e4m3x2 -> f16x2 instruction and widened to
// FP32; the block scale (times 64) multiplies the lane's partial dot, and the FP32 row scale the
// full dot (K) or the probability (V): q.k = s * sum_blocks b * sum_j q_j e2m1_j.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math_constants.h>
#include <stdint.h>

#include "trace_kernels/attention_decode_params.cuh"
#include "trace_kernels/attention_split_combine.cuh"
#include "trace_kernels/decode_timeline.cuh"
#include "trace_kernels/kv_codes.cuh"
#include "trace_kernels/nvfp4.cuh"
#include "trace_kernels/pdl.cuh"

namespace trace_kernels {

// One pipeline stage in shared memory: K codes, V codes, K block scales, V block scales, K row
// scales, V row scales of ROWS (token, kv head) rows, each array dense (bytes per row given).
template <int ROWS, int CODE_BYTES, int SCALE_BYTES, int ROW_SCALE_BYTES>
struct KvStageLayout {
  static constexpr int kOffKc = 0;
  static constexpr int kOffVc = kOffKc + ROWS * CODE_BYTES;
  static constexpr int kOffKb = kOffVc + ROWS * CODE_BYTES;
  static constexpr int kOffVb = kOffKb + ROWS * SCALE_BYTES;
  static constexpr int kOffKs = kOffVb + ROWS * SCALE_BYTES;
  static constexpr int kOffVs = kOffKs + ROWS * ROW_SCALE_BYTES;
  static constexpr int kLayoutBytes = kOffVs + ROWS * ROW_SCALE_BYTES;
};

template <bool NVFP4_, int D_, int HKV_, int GROUP_, int HEADS_PER_CTA_, int PAGE_, int TT_, int STAGES_>
struct DecodeAttentionConfig
    : KvStageLayout<TT_, NVFP4_ ? D_ / 2 : 2 * D_, NVFP4_ ? D_ / 16 : 0, NVFP4_ ? 4 : 0> {
  static constexpr bool kNvfp4 = NVFP4_;
  static constexpr int D = D_;
  static constexpr int HKV = HKV_;
  static constexpr int GROUP = GROUP_;            // q heads per kv head (Hq / Hkv)
  static constexpr int G = HEADS_PER_CTA_;        // q heads this CTA computes
  static constexpr int kHeadGroups = GROUP / G;   // CTAs per kv head along blockIdx.x
  static constexpr int P = PAGE_;                 // tokens per page
  static constexpr int TT = TT_;                  // tokens per tile
  static constexpr int STAGES = STAGES_;
  static constexpr int kThreads = 128;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int L = D / 8;                 // lanes per token row (8 elements each)
  static constexpr int kTokenGroups = kThreads / L;
  static constexpr int kTokensPerThread = TT / kTokenGroups;

  // Stage layout in shared memory (bytes per token row of one kv head).
  static constexpr int kCodeBytes = kNvfp4 ? D / 2 : 2 * D;  // codes (NVFP4) or bf16 data
  static constexpr int kScaleBytes = kNvfp4 ? D / 16 : 0;    // e4m3 block scales
  static constexpr int kStageBytes = DecodeAttentionConfig::kLayoutBytes;  // offsets: KvStageLayout
  static constexpr int kReduceBytes = kWarps * G * D * 4;  // end-of-CTA reduction, reuses the stages
  static constexpr int kSmemBytes = (STAGES * kStageBytes > kReduceBytes) ? STAGES * kStageBytes : kReduceBytes;

  static_assert(D % 32 == 0 && L <= 32 && (L & (L - 1)) == 0, "D must be 64, 128 or 256");
  static_assert(!kNvfp4 || (D / 16 == 4 || D / 16 == 8 || D / 16 == 16), "cp.async of block scales: 4/8/16 B");
  static_assert(G >= 1 && G <= 8 && (G & (G - 1)) == 0 && G <= L, "heads per CTA: a power of two <= min(8, D/8)");
  static_assert(GROUP % G == 0, "heads per CTA must divide the GQA group");
  static_assert(TT % kTokenGroups == 0 && TT <= 64 && TT % 32 == 0, "TT: 32 or 64 tokens");
  static_assert(STAGES >= 2, "at least double buffering");
  static_assert(kSmemBytes + TT * G * 4 + 3 * G * 4 <= 48 * 1024, "static shared memory limit");
};

namespace detail {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; src_bytes = 0 zero-fills the destination without reading.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}

template <int N>
__device__ __forceinline__ void cp_async_small(void* dst, const void* src, int src_bytes) {
  static_assert(N == 4 || N == 8 || N == 16, "cp.async.ca sizes");
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(smem_addr(dst)), "l"(src), "n"(N),
               "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// 8 E2M1 codes (element j in nibble j) -> their values / 64, exactly, in element order.
__device__ __forceinline__ void e2m1x8_to_float_div64(uint32_t w, float (&v)[8]) {
  // E4M3 byte with the nibble's bits in place: sign -> bit 7, (e1 e0 m) -> bits 4..2.
  const uint32_t even = ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u);  // elements 0, 2, 4, 6
  const uint32_t odd = ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u);         // elements 1, 3, 5, 7
  const __half2_raw e01 = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(even & 0xFFFFu), __NV_E4M3);
  const __half2_raw e23 = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(even >> 16), __NV_E4M3);
  const __half2_raw o01 = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(odd & 0xFFFFu), __NV_E4M3);
  const __half2_raw o23 = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(odd >> 16), __NV_E4M3);
  const float2 a = __half22float2(__half2(e01));  // elements 0, 2
  const float2 b = __half22float2(__half2(e23));  // elements 4, 6
  const float2 c = __half22float2(__half2(o01));  // elements 1, 3
  const float2 d = __half22float2(__half2(o23));  // elements 5, 7
  v[0] = a.x; v[2] = a.y; v[4] = b.x; v[6] = b.y;
  v[1] = c.x; v[3] = c.y; v[5] = d.x; v[7] = d.y;
}

__device__ __forceinline__ void bf16x8_to_float(uint4 raw, float (&v)[8]) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(w[i] << 16);
    v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}

// Transposed butterfly over the L lanes of a row group: on entry each lane holds G partial sums,
// on exit lane l holds the full sum of head head_of_lane<L, G>(l) in v[0].
template <int L, int G>
__device__ __forceinline__ void reduce_transposed(float (&v)[G], int lane) {
#pragma unroll
  for (int step = 0; (L >> (step + 1)) >= 1; ++step) {
    const int offset = L >> (step + 1);
    const int count = G >> step;
    const bool upper = (lane & offset) != 0;
    if (count > 1) {
#pragma unroll
      for (int i = 0; i < count / 2; ++i) {
        const float send = upper ? v[i] : v[i + count / 2];
        const float keep = upper ? v[i + count / 2] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, offset);
      }
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], offset);
    }
  }
}

template <int L, int G>
__device__ __forceinline__ int head_of_lane(int lane) {
  int head = 0;
#pragma unroll
  for (int step = 0; (G >> step) > 1; ++step)
    if (lane & (L >> (step + 1))) head += G >> (step + 1);
  return head;
}

// The lane that writes head head_of_lane's score: the lowest lane of its replica set.
template <int L, int G>
__device__ __forceinline__ bool score_writer(int lane) {
  return (lane & (L / G - 1)) == 0;
}

}  // namespace detail

// Stage the pages of tokens [pos0, pos0 + TT) of sequence b (positions >= end are zero-filled).
template <class Cfg>
__device__ __forceinline__ void load_tile(uint8_t* stage, const DecodeParams& p, int b, int kv_head, int pos0,
                                          int end) {
  constexpr int kChunks = Cfg::kCodeBytes / 16;  // 16-byte chunks per token row
  const int* table = p.block_table + static_cast<int64_t>(b) * p.max_pages;
#pragma unroll
  for (int i = threadIdx.x; i < Cfg::TT * kChunks; i += Cfg::kThreads) {
    const int t = i / kChunks;
    const int chunk = i - t * kChunks;
    const int pos = pos0 + t;
    int64_t row = 0;
    const bool valid = pos < end;
    if (valid) row = (static_cast<int64_t>(table[pos / Cfg::P]) * Cfg::P + pos % Cfg::P) * Cfg::HKV + kv_head;
    const int64_t offset = row * Cfg::kCodeBytes + chunk * 16;
    const int bytes = valid ? 16 : 0;
    detail::cp_async16(stage + Cfg::kOffKc + t * Cfg::kCodeBytes + chunk * 16, p.k_codes + offset, bytes);
    detail::cp_async16(stage + Cfg::kOffVc + t * Cfg::kCodeBytes + chunk * 16, p.v_codes + offset, bytes);
  }
  if constexpr (Cfg::kNvfp4) {
    constexpr int kSb = Cfg::kScaleBytes;
#pragma unroll
    for (int t = threadIdx.x; t < Cfg::TT; t += Cfg::kThreads) {
      const int pos = pos0 + t;
      int64_t row = 0;
      const bool valid = pos < end;
      if (valid) row = (static_cast<int64_t>(table[pos / Cfg::P]) * Cfg::P + pos % Cfg::P) * Cfg::HKV + kv_head;
      detail::cp_async_small<kSb>(stage + Cfg::kOffKb + t * kSb, p.k_block_scales + row * kSb, valid ? kSb : 0);
      detail::cp_async_small<kSb>(stage + Cfg::kOffVb + t * kSb, p.v_block_scales + row * kSb, valid ? kSb : 0);
      detail::cp_async_small<4>(stage + Cfg::kOffKs + t * 4, p.k_scale + row, valid ? 4 : 0);
      detail::cp_async_small<4>(stage + Cfg::kOffVs + t * 4, p.v_scale + row, valid ? 4 : 0);
    }
  }
}

// The tokens [pos_begin, pos_end) that split `split` of sequence b covers, in num_tiles tiles of TT.
struct SplitRange {
  int pos_begin;
  int pos_end;
  int num_tiles;
};

// Every decode kernel's first read of global memory. Launched as a programmatic dependent (attention.DECODE_PDL), the
// kernel's CTAs may start while the previous kernel on the stream runs; they wait here until it has completed (q,
// the pages, the block table and the lengths may all be its outputs).
template <class Cfg>
__device__ __forceinline__ SplitRange split_range(const DecodeParams& p, int b, int split) {
  constexpr int TT = Cfg::TT;
  pdl::wait_for_prerequisite_grid();
  const int length = min(p.lengths[b], p.max_pages * Cfg::P);  // never index past the block table
  const SplitTiles tiles = split_tiles(p, split);
  SplitRange r;
  r.pos_begin = tiles.first * TT;
  r.pos_end = min(length, r.pos_begin + tiles.count * TT);
  r.num_tiles = r.pos_end > r.pos_begin ? (r.pos_end - r.pos_begin + TT - 1) / TT : 0;
  return r;
}

// The split's cp.async pipeline of STAGES stages, loaded by LoadTile (load_tile<Cfg> or a variant's own).
// Before the tile loop: tiles 0 .. STAGES - 2 in flight. One commit per stage even when nothing is
// loaded, so that wait_group STAGES - 1 below always means "tile `tile` has landed".
template <class Cfg, auto LoadTile>
__device__ __forceinline__ void pipeline_prefetch(uint8_t* smem, const DecodeParams& p, int b, int kv_head,
                                                  const SplitRange& r) {
#pragma unroll
  for (int s = 0; s < Cfg::STAGES - 1; ++s) {
    if (s < r.num_tiles) LoadTile(smem + s * Cfg::kStageBytes, p, b, kv_head, r.pos_begin + s * Cfg::TT, r.pos_end);
    detail::cp_async_commit();
  }
}

// At the top of iteration `tile`: issue tile + STAGES - 1, wait for `tile`, return its stage.
template <class Cfg, auto LoadTile>
__device__ __forceinline__ const uint8_t* pipeline_next_stage(uint8_t* smem, const DecodeParams& p, int b,
                                                              int kv_head, const SplitRange& r, int tile) {
  const int next = tile + Cfg::STAGES - 1;
  if (next < r.num_tiles)
    LoadTile(smem + (next % Cfg::STAGES) * Cfg::kStageBytes, p, b, kv_head, r.pos_begin + next * Cfg::TT, r.pos_end);
  detail::cp_async_commit();
  detail::cp_async_wait<Cfg::STAGES - 1>();
  __syncthreads();
  return smem + (tile % Cfg::STAGES) * Cfg::kStageBytes;
}

// Element d of head row bh's result: straight to out (one split), or the split's partial o and its
// log2-domain log-sum-exp m + log2(l) (-inf when the split saw nothing) for decode_attention_combine.
template <int D>
__device__ __forceinline__ void store_split_output(const DecodeParams& p, int64_t bh, int d, int split,
                                                   int num_splits, float o, float m, float l) {
  if (num_splits == 1) {
    p.out[bh * D + d] = __float2bfloat16_rn(o);
  } else {
    p.o_part[(bh * num_splits + split) * D + d] = o;
    if (d == 0) p.lse_part[bh * num_splits + split] = l > 0.f ? m + log2f(l) : -CUDART_INF_F;
  }
}

// store_split_output of elements d .. d + 7 (d a multiple of 8): two 16-byte stores, or the 8 bf16 values in one.
template <int D>
__device__ __forceinline__ void store_split_output8(const DecodeParams& p, int64_t bh, int d, int split,
                                                    int num_splits, const float (&o)[8], float m, float l) {
  if (num_splits == 1) {
    uint32_t bits[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(o[2 * j], o[2 * j + 1]);
      bits[j] = *reinterpret_cast<const uint32_t*>(&pair);
    }
    *reinterpret_cast<uint4*>(p.out + bh * D + d) = make_uint4(bits[0], bits[1], bits[2], bits[3]);
  } else {
    float4* part = reinterpret_cast<float4*>(p.o_part + (bh * num_splits + split) * D + d);
    part[0] = make_float4(o[0], o[1], o[2], o[3]);
    part[1] = make_float4(o[4], o[5], o[6], o[7]);
    if (d == 0) p.lse_part[bh * num_splits + split] = l > 0.f ? m + log2f(l) : -CUDART_INF_F;
  }
}

template <class Cfg>
__device__ __forceinline__ void decode_attention(const DecodeParams& p) {
  constexpr int G = Cfg::G, D = Cfg::D, L = Cfg::L, TT = Cfg::TT;
  __shared__ __align__(16) uint8_t smem[Cfg::kSmemBytes];
  __shared__ __align__(16) float probs[TT][G];  // scores, then p * (row scale of V)
  __shared__ float run_max[G], run_sum[G], rescale[G];

  const int kv_head = blockIdx.x / Cfg::kHeadGroups;
  const int head0 = kv_head * Cfg::GROUP + (blockIdx.x % Cfg::kHeadGroups) * G;  // first q head
  const DecodeCta cta = decode_cta(p);
  const int split = cta.split;
  const int num_splits = gridDim.y;
  const int b = cta.b;
  const int hq = Cfg::HKV * Cfg::GROUP;
  const int lane = threadIdx.x % L;        // d chunk: elements 8 lane .. 8 lane + 7
  const int token_group = threadIdx.x / L;

  const SplitRange range = split_range<Cfg>(p, b, split);
  const int pos_begin = range.pos_begin, pos_end = range.pos_end, num_tiles = range.num_tiles;

  // q rows of this CTA's heads, this lane's 8 elements, pre-scaled by softmax_scale * log2(e).
  float qf[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p.q + (static_cast<int64_t>(b) * hq + head0 + g) * D + lane * 8);
    detail::bf16x8_to_float(raw, qf[g]);
#pragma unroll
    for (int j = 0; j < 8; ++j) qf[g][j] *= p.scale_log2;
  }
  float acc[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[g][j] = 0.f;
  if (threadIdx.x < G) {
    run_max[threadIdx.x] = -CUDART_INF_F;
    run_sum[threadIdx.x] = 0.f;
  }

  pipeline_prefetch<Cfg, load_tile<Cfg>>(smem, p, b, kv_head, range);

  for (int tile = 0; tile < num_tiles; ++tile) {
    const uint8_t* stage = pipeline_next_stage<Cfg, load_tile<Cfg>>(smem, p, b, kv_head, range, tile);
    const int pos0 = pos_begin + tile * TT;

    // (1) scores of this tile's tokens for the G heads, log2 domain.
#pragma unroll
    for (int i = 0; i < Cfg::kTokensPerThread; ++i) {
      const int t = token_group + i * Cfg::kTokenGroups;
      float kf[8];
      float partial[G];
      if constexpr (Cfg::kNvfp4) {
        const uint32_t w = *reinterpret_cast<const uint32_t*>(stage + Cfg::kOffKc + t * Cfg::kCodeBytes + lane * 4);
        detail::e2m1x8_to_float_div64(kv_codes::nibbles(w), kf);
        const float b64 = 64.f * nvfp4::e4m3_to_float(stage[Cfg::kOffKb + t * Cfg::kScaleBytes + lane / 2]);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          float dot = 0.f;
#pragma unroll
          for (int j = 0; j < 8; ++j) dot = fmaf(qf[g][j], kf[j], dot);
          partial[g] = dot * b64;
        }
      } else {
        detail::bf16x8_to_float(*reinterpret_cast<const uint4*>(stage + Cfg::kOffKc + t * Cfg::kCodeBytes + lane * 16),
                                kf);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          float dot = 0.f;
#pragma unroll
          for (int j = 0; j < 8; ++j) dot = fmaf(qf[g][j], kf[j], dot);
          partial[g] = dot;
        }
      }
      detail::reduce_transposed<L, G>(partial, lane);
      if (detail::score_writer<L, G>(lane)) {
        float score = partial[0];
        if constexpr (Cfg::kNvfp4) score *= reinterpret_cast<const float*>(stage + Cfg::kOffKs)[t];
        probs[t][detail::head_of_lane<L, G>(lane)] = (pos0 + t < pos_end) ? score : -CUDART_INF_F;
      }
    }
    __syncthreads();

    // (2) online softmax: warp w owns heads w, w + 4, ...; lanes cover the tile's tokens.
    for (int g = threadIdx.x / 32; g < G; g += Cfg::kWarps) {
      const int l32 = threadIdx.x % 32;
      float tile_max = -CUDART_INF_F;
#pragma unroll
      for (int t = l32; t < TT; t += 32) tile_max = fmaxf(tile_max, probs[t][g]);
#pragma unroll
      for (int o = 16; o >= 1; o /= 2) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, o));
      const float old_max = run_max[g];
      const float new_max = fmaxf(old_max, tile_max);
      const bool empty = new_max == -CUDART_INF_F;
      const float alpha = (empty || old_max == -CUDART_INF_F) ? (empty ? 1.f : 0.f) : exp2f(old_max - new_max);
      float sum = 0.f;
#pragma unroll
      for (int t = l32; t < TT; t += 32) {
        const float e = empty ? 0.f : exp2f(probs[t][g] - new_max);  // -inf -> 0
        sum += e;
        float weight = e;
        if constexpr (Cfg::kNvfp4) weight *= reinterpret_cast<const float*>(stage + Cfg::kOffVs)[t];
        probs[t][g] = weight;
      }
#pragma unroll
      for (int o = 16; o >= 1; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      __syncwarp();
      if (l32 == 0) {
        run_max[g] = new_max;
        run_sum[g] = run_sum[g] * alpha + sum;
        rescale[g] = alpha;
      }
    }
    __syncthreads();

    // (3) acc = acc * alpha + P.V
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float alpha = rescale[g];
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[g][j] *= alpha;
    }
#pragma unroll
    for (int i = 0; i < Cfg::kTokensPerThread; ++i) {
      const int t = token_group + i * Cfg::kTokenGroups;
      float vf[8];
      float vscale = 1.f;
      if constexpr (Cfg::kNvfp4) {
        const uint32_t w = *reinterpret_cast<const uint32_t*>(stage + Cfg::kOffVc + t * Cfg::kCodeBytes + lane * 4);
        detail::e2m1x8_to_float_div64(kv_codes::nibbles(w), vf);
        vscale = 64.f * nvfp4::e4m3_to_float(stage[Cfg::kOffVb + t * Cfg::kScaleBytes + lane / 2]);
      } else {
        detail::bf16x8_to_float(*reinterpret_cast<const uint4*>(stage + Cfg::kOffVc + t * Cfg::kCodeBytes + lane * 16),
                                vf);
      }
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float w = probs[t][g] * vscale;
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[g][j] = fmaf(w, vf[j], acc[g][j]);
      }
    }
    __syncthreads();  // the stage and probs are rewritten next iteration
  }
  detail::cp_async_wait<0>();
  __syncthreads();

  // Reduce acc over the token groups: inside the warp by shuffles, across warps in shared memory.
#pragma unroll
  for (int o = L; o < 32; o *= 2)
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[g][j] += __shfl_xor_sync(0xffffffffu, acc[g][j], o);
  float* red = reinterpret_cast<float*>(smem);  // [warps][G][D]
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 < L) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float4* dst = reinterpret_cast<float4*>(red + (warp * G + g) * D + lane * 8);
      dst[0] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
      dst[1] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * D; idx += Cfg::kThreads) {
    const int g = idx / D;
    const int d = idx - g * D;
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < Cfg::kWarps; ++w) o += red[(w * G + g) * D + d];
    const float l = run_sum[g];
    o = l > 0.f ? o / l : 0.f;
    const int64_t bh = static_cast<int64_t>(b) * hq + head0 + g;
    store_split_output<D>(p, bh, d, split, num_splits, o, run_max[g], l);
  }
  combine_splits_in_kernel<D, Cfg::kThreads, Cfg::kSmemBytes / 4>(p, b, hq, G, [&](int r) { return head0 + r; },
                                                                   reinterpret_cast<float*>(smem));
}

}  // namespace trace_kernels
