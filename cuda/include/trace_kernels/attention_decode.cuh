// Split-KV (flash-decoding) paged decode attention: what every decode kernel shares.
//
//   q [B, Hq, D] bf16, pages (docs/kv_cache.md), block_table int32 [B, max_pages], lengths int32 [B]
//   -> out [B, Hq, D] bf16 (one split), or per-split partials o [B, Hq, S, D] f32 + lse [B, Hq, S]
//      (log2 domain) that attention_split_combine.cuh merges.
//
// The shared memory layout of a pipeline stage, cp.async copies, a split's token range (the kernel's first read), the
// cp.async tile pipeline and the split output stores. The kernels: attention_decode_mma.cuh (BF16 pages),
// attention_decode_mma2.cuh and attention_decode_mma4.cuh (NVFP4 pages).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math_constants.h>
#include <stdint.h>

#include "trace_kernels/attention_decode_params.cuh"
#include "trace_kernels/cta_timeline.cuh"
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

__device__ __forceinline__ void bf16x8_to_float(uint4 raw, float (&v)[8]) {
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(w[i] << 16);
    v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
}

}  // namespace detail

// Stage the BF16 pages of tokens [pos0, pos0 + TT) of sequence b (positions >= end are zero-filled).
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
  SplitRange r;
  r.pos_begin = split * p.tiles_per_split * TT;
  r.pos_end = min(length, r.pos_begin + p.tiles_per_split * TT);
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

}  // namespace trace_kernels
