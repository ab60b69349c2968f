// NVFP4 paged split-KV decode attention, "mma2": the tensor-core kernel with tokens as the MMA rows.
//
// Why: `mma` (attention_decode_mma.cuh) puts the q heads on the 16 M rows, so with GQA 8 half of
// every MMA, of the accumulators and of their rescaling is zero rows, and the SASS of its tile loop
// is ~105 warp instructions per (token, kv head) (1679 per thread per 64-token tile, 4 warps): the
// SM issues ~26 cycles per token before any stall, which is the 32-34 cycles measured. Here the
// roles are transposed so no row is wasted for up to 8 heads per CTA:
//   S^T[tok, h] = K[tok, :] . Q^T[:, h]     (A = K dequantized, 16 tokens; B = Q, 8 heads)
//   O^T[d, h]  += V^T[d, tok] . P^T[tok, h]  (A = V dequantized, 16 d rows; B = P, via movmatrix)
// so per 16 tokens QK is 8 MMAs (not 16), PV is D/16 MMAs (not D/8), the accumulator is D/16 x 4
// registers (not D/8 x 4), and each warp runs 32 tokens per tile step (one softmax update, one
// accumulator rescale per 32 tokens). Operands are exact FP16: the cache's code words decode into
// FP16 pairs value / 2^14 by two shifts and one LOP3 each (kv_codes.cuh; for V after one byte permute
// that pairs two tokens), times the E4M3 block scale as f16x2 (one HMUL2 per pair; the 2^14 is folded
// into the FP32 score and output scales). FP16 because P is FP16 (2^-11 relative rounding).
// The FP32 row scale of K multiplies the score; that of V enters as log2(s_v) added to the score of
// the numerator (a second running max M), so P stays in [0, 1]:
//   o = 2^14 * 2^(M - m) * sum_t 2^(s_t + log2 sv_t - M) v~_t / sum_t 2^(s_t - m)
// Tiles of 32 * kWarps tokens are staged by cp.async, STAGES deep, with page lookups per 16-byte
// chunk row and compile-time trip counts (no loop remainders). Same DecodeParams, split-KV partials
// and combine kernel as the other variants.
#pragma once

#include <cfloat>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math_constants.h>
#include <stdint.h>

#include "trace_kernels/attention_decode_mma.cuh"
#include "trace_kernels/cta_timeline.cuh"
#include "trace_kernels/kv_codes.cuh"

namespace trace_kernels {

template <int D_, int HKV_, int GROUP_, int HEADS_PER_CTA_, int PAGE_, int WARPS_, int STAGES_>
struct DecodeAttentionMma2Config : KvStageLayout</*TT=*/32 * WARPS_, D_ / 2, D_ / 16, 4> {
  static constexpr bool kNvfp4 = true;
  static constexpr int D = D_;
  static constexpr int HKV = HKV_;
  static constexpr int GROUP = GROUP_;
  static constexpr int G = HEADS_PER_CTA_;  // MMA columns used (<= 8)
  static constexpr int kHeadGroups = GROUP / G;
  static constexpr int P = PAGE_;
  static constexpr int kWarps = WARPS_;
  static constexpr int kTokensPerWarp = 32;  // two 16-token MMA row blocks
  static constexpr int TT = kWarps * kTokensPerWarp;
  static constexpr int STAGES = STAGES_;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kCodeBytes = D / 2;
  static constexpr int kScaleBytes = D / 16;
  static constexpr int kStageBytes = DecodeAttentionMma2Config::kLayoutBytes;  // offsets: KvStageLayout
  static constexpr int kKWords = D / 32;  // QK: code words per token per thread (D/4 elements)
  static constexpr int kKSteps = D / 16;  // QK k-steps
  static constexpr int kVWords = D / 64;  // PV: code words per token per thread (D/8 elements)
  static constexpr int kMTiles = D / 16;  // PV m-tiles (d rows)
  static constexpr int kReduceFloats = kWarps * (8 * D + 3 * 8);  // acc [8 heads][D] + (m, l, M)
  static constexpr int kSmemBytes = STAGES * kStageBytes > kReduceFloats * 4 ? STAGES * kStageBytes : kReduceFloats * 4;
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(G >= 1 && G <= 8 && GROUP % G == 0, "up to 8 q heads per CTA (the N of one MMA)");
  static_assert((TT * (kCodeBytes / 16)) % kThreads == 0 && TT % kThreads == 0, "whole loader passes");
  static_assert(kSmemBytes <= 48 * 1024, "static shared memory limit");
  // Layout hooks shared with the page-wide loader (attention_decode_mma4.cuh): one kv head per CTA
  // (blockIdx.x), every warp on it, rows of one head in token order, static shared memory.
  static constexpr int kKvHeadsPerCta = 1;
  static constexpr int kWarpsPerHead = kWarps;
  static constexpr bool kDynamicSmem = false;
  static constexpr bool kZeroTailScales = false;  // cp.async zero-fills every position >= end
  static constexpr bool kBulk = false;            // stages filled by LoadTile's cp.async, not bulk copies
  __device__ static __forceinline__ int code_row(int tok, int) { return tok; }
  __device__ static __forceinline__ int scale_row(int tok, int) { return tok; }
};

namespace mma2_detail {

__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// 2^x with flush to zero: weights below 2^-126 of the running max do not reach FP16 operands or
// FP32 sums anyway; one MUFU.EX2 instead of exp2f's denormal-range handling. ex2(-inf) = 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// {b, b} as f16x2 for E4M3 byte `sel` (0..3) of w: the byte duplicated, then one e4m3x2 -> f16x2.
template <int SEL>
__device__ __forceinline__ uint32_t scale_pair(uint32_t w) {
  return mma_detail::e4m3x2_to_f16x2(__byte_perm(w, 0u, SEL * 0x11u));
}

// Max over the 8 lanes sharing lane % 4 (the MMA rows gid = 0..7 of one column pair).
__device__ __forceinline__ float column_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
}

__device__ __forceinline__ float column_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  v += __shfl_xor_sync(0xffffffffu, v, 8);
  return v + __shfl_xor_sync(0xffffffffu, v, 16);
}

// Zero the N (4 or 8) E4M3 block-scale bytes at dst (N-byte aligned).
template <int N>
__device__ __forceinline__ void zero_scale_row(uint8_t* dst) {
  static_assert(N == 4 || N == 8, "D / 16 block scales: 4 (D = 64) or 8 (D = 128) bytes");
  if constexpr (N == 8) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(0u, 0u);
  } else {
    *reinterpret_cast<uint32_t*>(dst) = 0u;
  }
}

}  // namespace mma2_detail

// Stage tokens [pos0, pos0 + TT) of sequence b; trip counts are compile-time, positions >= end
// are zero-filled (the page lookup is skipped for them).
template <class Cfg>
__device__ __forceinline__ void load_tile_mma2(uint8_t* stage, const DecodeParams& p, int b, int kv_head, int pos0,
                                               int end) {
  constexpr int kChunks = Cfg::kCodeBytes / 16;
  const int* table = p.block_table + static_cast<int64_t>(b) * p.max_pages;
#pragma unroll
  for (int it = 0; it < Cfg::TT * kChunks / Cfg::kThreads; ++it) {
    const int i = it * Cfg::kThreads + threadIdx.x;
    const int t = i / kChunks;
    const int chunk = i % kChunks;
    const int pos = pos0 + t;
    const bool valid = pos < end;
    const int64_t row =
        valid ? (static_cast<int64_t>(table[pos / Cfg::P]) * Cfg::P + pos % Cfg::P) * Cfg::HKV + kv_head : 0;
    const int64_t offset = row * Cfg::kCodeBytes + chunk * 16;
    detail::cp_async16(stage + Cfg::kOffKc + t * Cfg::kCodeBytes + chunk * 16, p.k_codes + offset, valid ? 16 : 0);
    detail::cp_async16(stage + Cfg::kOffVc + t * Cfg::kCodeBytes + chunk * 16, p.v_codes + offset, valid ? 16 : 0);
  }
  constexpr int kSb = Cfg::kScaleBytes;
#pragma unroll
  for (int it = 0; it < Cfg::TT / Cfg::kThreads; ++it) {
    const int t = it * Cfg::kThreads + threadIdx.x;
    const int pos = pos0 + t;
    const bool valid = pos < end;
    const int64_t row =
        valid ? (static_cast<int64_t>(table[pos / Cfg::P]) * Cfg::P + pos % Cfg::P) * Cfg::HKV + kv_head : 0;
    detail::cp_async_small<kSb>(stage + Cfg::kOffKb + t * kSb, p.k_block_scales + row * kSb, valid ? kSb : 0);
    detail::cp_async_small<kSb>(stage + Cfg::kOffVb + t * kSb, p.v_block_scales + row * kSb, valid ? kSb : 0);
    detail::cp_async_small<4>(stage + Cfg::kOffKs + t * 4, p.k_scale + row, valid ? 4 : 0);
    detail::cp_async_small<4>(stage + Cfg::kOffVs + t * 4, p.v_scale + row, valid ? 4 : 0);
  }
}

// The kernel body. LoadTile stages one tile (load_tile_mma2 for mma2; mma4l loads its stages in bulk). kLean
// (mma4l): (1) lazy rescaling: the running maxima move only when a tile's max exceeds them by more
// than kLazyLog2, so most tiles skip the alpha / beta exponentials and the accumulator rescale; the
// weights are then at most 2^kLazyLog2 (FP16 rounds them with the same relative error) and every
// sum stays relative to the same stale max, which the end-of-CTA merge and the split output use
// consistently; (2) one log2 of the V row scale per token (lane i of the warp, then shuffled)
// instead of one in each of the 4 lanes that share a token row; (3) the lazy test reads each lane's own maxima, and
// only a tile that rescales reduces them over the column's 8 lanes (12 shuffles and 12 max per tile otherwise).
constexpr float kLazyLog2 = 8.f;

template <class Cfg, auto LoadTile, bool kLean>
__device__ __forceinline__ void decode_attention_mma2_tiles(const DecodeParams& p) {
  using namespace mma_detail;
  using namespace mma2_detail;
  constexpr int D = Cfg::D, G = Cfg::G, TT = Cfg::TT;
  // MMA column blocks of 8 q heads: 1 up to G = 8; 2 (mma4l_c16) up to 16, every dequantized K / V fragment then
  // feeds two MMAs, so a GQA group of 9-16 reads its kv head's bytes once instead of in two CTAs
  constexpr int NC = (G + 7) / 8;
  static_assert(NC == 1 || NC == 2, "up to 16 q heads per kv head and CTA");
  uint8_t* smem;
  if constexpr (Cfg::kDynamicSmem) {
    extern __shared__ __align__(128) uint8_t dynamic_smem[];
    smem = dynamic_smem;
    uint32_t dynamic_bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynamic_bytes));
    if (dynamic_bytes < Cfg::kSmemBytes) __trap();  // a launch with less than the layout needs: fail loudly
  } else {
    __shared__ __align__(16) uint8_t static_smem[Cfg::kSmemBytes];
    smem = static_smem;
  }

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  // kv head of this warp: the CTA's (blockIdx.x / head groups) when a CTA reads one head's rows, the
  // warp's group of kWarpsPerHead warps when it reads whole pages (mma4); h_local indexes the stage rows
  const int h_local = Cfg::kKvHeadsPerCta == 1 ? 0 : warp / Cfg::kWarpsPerHead;
  const int kv_head = Cfg::kKvHeadsPerCta == 1 ? blockIdx.x / Cfg::kHeadGroups : h_local;
  const int head_group = Cfg::kKvHeadsPerCta == 1 ? blockIdx.x % Cfg::kHeadGroups : blockIdx.x;
  const int head0 = kv_head * Cfg::GROUP + head_group * G;
  const int split = blockIdx.y;
  const int num_splits = gridDim.y;
  const int b = blockIdx.z;
  const int hq = Cfg::HKV * Cfg::GROUP;
  const int gid = lane / 4;  // QK: token row / B column (head gid); PV: d rows
  const int tig = lane % 4;  // QK: D quarter; C columns = heads 2 tig, 2 tig + 1

  CTA_STAMP(0);  // diagnostic timeline (cta_timeline.cuh): empty unless TRACE_KERNELS_CTA_TIMELINE
  const SplitRange range = split_range<Cfg>(p, b, split);
  const int pos_begin = range.pos_begin, pos_end = range.pos_end, num_tiles = range.num_tiles;
  CTA_STAMP(1);
  CTA_NOTE(num_tiles);

  // The first tiles' copies go out before q is read, so q's loads and scaling overlap their flight.
  uint32_t loader_slot = 0;  // kBulk: this lane's page slot in the next tile it copies
  if constexpr (Cfg::kBulk) {
    Cfg::pipeline_start(smem, p, b, range, loader_slot);
  } else {
    pipeline_prefetch<Cfg, LoadTile>(smem, p, b, kv_head, range);
  }

  // Q of head gid as QK B fragments, scaled by a power of two c into FP16 range. Thread tig owns
  // elements [tig D/4, (tig + 1) D/4); k-step s = 2 i + h: b0 = elements {8i + 4h, +1}, b1 = {+2, +3}
  // (the K A fragment below takes the same elements from its code words: field pairs 2h and 2h + 1).
  uint32_t qb[NC][Cfg::kKSteps][2];
  float head_scale[NC][2];  // 2^14 * softmax_scale * log2(e) / c, for heads 8 nc + 2 tig and 8 nc + 2 tig + 1
#pragma unroll
  for (int nc = 0; nc < NC; ++nc) {
    float qv[D / 4];
    float amax = 0.f;
#pragma unroll
    for (int v = 0; v < D / 32; ++v) {
      float f[8];
      if (8 * nc + gid < G) {
        const int64_t head = static_cast<int64_t>(b) * hq + head0 + 8 * nc + gid;
        const uint4 raw = *reinterpret_cast<const uint4*>(p.q + head * D + tig * (D / 4) + v * 8);
        detail::bf16x8_to_float(raw, f);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) f[j] = 0.f;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        qv[v * 8 + j] = f[j];
        amax = fmaxf(amax, fabsf(f[j]));
      }
    }
    amax = quad_max(amax);
    int e = 0;
    frexpf(amax, &e);
    const int shift = amax > 0.f ? max(-126, min(127, 15 - e)) : 0;  // amax * 2^shift in [2^14, 2^15)
    const float c = ldexpf(1.f, shift);
    const float my_scale = kv_codes::kValueFold * p.scale_log2 * ldexpf(1.f, -shift);
#pragma unroll
    for (int j = 0; j < D / 4; ++j) qv[j] *= c;
#pragma unroll
    for (int s = 0; s < Cfg::kKSteps; ++s) {
      const int base = (s / 2) * 8 + (s % 2) * 4;
      qb[nc][s][0] = pack_f16x2(qv[base], qv[base + 1]);
      qb[nc][s][1] = pack_f16x2(qv[base + 2], qv[base + 3]);
    }
    head_scale[nc][0] = __shfl_sync(0xffffffffu, my_scale, 4 * (2 * tig));  // lane of gid = 2 tig
    head_scale[nc][1] = __shfl_sync(0xffffffffu, my_scale, 4 * (2 * tig + 1));
  }

  float acc[NC][Cfg::kMTiles][4];  // rows d, columns heads 8 nc + 2 tig, 8 nc + 2 tig + 1
#pragma unroll
  for (int nc = 0; nc < NC; ++nc)
#pragma unroll
    for (int j = 0; j < Cfg::kMTiles; ++j) acc[nc][j][0] = acc[nc][j][1] = acc[nc][j][2] = acc[nc][j][3] = 0.f;
  // Finite start (not -inf): exp2(start - m) is then 0 or 1, never NaN, even for fully masked rows.
  float run_m[NC][2];  // max score (log2 domain) per head column
  float run_M[NC][2];  // max of score + log2(s_v)
  float run_l[NC][2];  // this thread's part of sum 2^(score - m)
#pragma unroll
  for (int nc = 0; nc < NC; ++nc) {
    run_m[nc][0] = run_m[nc][1] = -FLT_MAX;
    run_M[nc][0] = run_M[nc][1] = -FLT_MAX;
    run_l[nc][0] = run_l[nc][1] = 0.f;
  }

  CTA_STAMP(2);
  for (int tile = 0; tile < num_tiles; ++tile) {
    if constexpr (Cfg::kBulk) {
      Cfg::pipeline_next(smem, p, b, range, tile, loader_slot);  // issue tile + STAGES - 1, wait for tile
    } else {  // pipeline_next_stage's steps, written out: the call changes this kernel's SASS at D = 64
      const int next = tile + Cfg::STAGES - 1;
      if (next < num_tiles)
        LoadTile(smem + (next % Cfg::STAGES) * Cfg::kStageBytes, p, b, kv_head, pos_begin + next * TT, pos_end);
      detail::cp_async_commit();
      detail::cp_async_wait<Cfg::STAGES - 1>();
      __syncthreads();
    }
    if (tile == 0) CTA_STAMP(3);
    const uint8_t* stage = smem + (tile % Cfg::STAGES) * Cfg::kStageBytes;
    const float* k_scale = reinterpret_cast<const float*>(stage + Cfg::kOffKs);
    const float* v_scale = reinterpret_cast<const float*>(stage + Cfg::kOffVs);
    const int tile_pos = pos_begin + tile * TT;
    const int chunk = (Cfg::kKvHeadsPerCta == 1 ? warp : warp % Cfg::kWarpsPerHead) * Cfg::kTokensPerWarp;
    if constexpr (Cfg::kZeroTailScales) {
      // Positions >= end of a copied page hold whatever the cache holds there (a NaN E4M3 scale
      // times a zero weight is NaN in P.V): zero this warp's V block scales of those tokens.
      if (tile_pos + chunk + Cfg::kTokensPerWarp > pos_end) {
        if (tile_pos + chunk + lane >= pos_end)
          zero_scale_row<Cfg::kScaleBytes>(const_cast<uint8_t*>(stage) + Cfg::kOffVb +
                                           Cfg::scale_row(chunk + lane, h_local) * Cfg::kScaleBytes);
        __syncwarp();
      }
    }
    float lane_lv = -CUDART_INF_F;  // kLean: log2 of the V row scale of token chunk + lane, -inf past the end
    if constexpr (kLean) {
      if (tile_pos + chunk + lane < pos_end) lane_lv = __log2f(v_scale[Cfg::scale_row(chunk + lane, h_local)]);
    }

    // ---- S^T for 2 blocks of 16 tokens: rows gid, gid + 8 = tokens; columns = heads 2 tig, 2 tig + 1
    float sc[NC][2][4];
    float lv[2][2];  // log2 of the V row scale of tokens gid, gid + 8
#pragma unroll
    for (int u = 0; u < 2; ++u) {
#pragma unroll
      for (int nc = 0; nc < NC; ++nc) sc[nc][u][0] = sc[nc][u][1] = sc[nc][u][2] = sc[nc][u][3] = 0.f;
      uint32_t words[2][Cfg::kKWords];
      uint32_t scales[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int tok = chunk + 16 * u + 8 * r + gid;
        const uint8_t* row = stage + Cfg::kOffKc + Cfg::code_row(tok, h_local) * Cfg::kCodeBytes + tig * (D / 8);
        if constexpr (Cfg::kKWords == 4) {
          const uint4 w4 = *reinterpret_cast<const uint4*>(row);
          words[r][0] = w4.x; words[r][1] = w4.y; words[r][2] = w4.z; words[r][3] = w4.w;
          scales[r] = *reinterpret_cast<const uint16_t*>(stage + Cfg::kOffKb +
                                                         Cfg::scale_row(tok, h_local) * Cfg::kScaleBytes + 2 * tig);
        } else {
          const uint2 w2 = *reinterpret_cast<const uint2*>(row);
          words[r][0] = w2.x; words[r][1] = w2.y;
          scales[r] = stage[Cfg::kOffKb + Cfg::scale_row(tok, h_local) * Cfg::kScaleBytes + tig];
        }
      }
#pragma unroll
      for (int i = 0; i < Cfg::kKWords; ++i) {
        uint32_t a[2][4];  // [token row][pair j]: elements 2j, 2j + 1 of the word
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          // word i covers elements 8i..8i+7 of the thread's D/4: block 2 tig + i / 2 (D = 128), tig (D = 64)
          const uint32_t s2 = (Cfg::kKWords == 4 && i >= 2) ? scale_pair<1>(scales[r]) : scale_pair<0>(scales[r]);
          uint32_t f[4];
          kv_codes::fields(words[r][i], f);
#pragma unroll
          for (int j = 0; j < 4; ++j) a[r][j] = hmul2(f[j], s2);
        }
#pragma unroll
        for (int nc = 0; nc < NC; ++nc) {
          mma_f16(sc[nc][u], a[0][0], a[1][0], a[0][1], a[1][1], qb[nc][2 * i][0], qb[nc][2 * i][1]);
          mma_f16(sc[nc][u], a[0][2], a[1][2], a[0][3], a[1][3], qb[nc][2 * i + 1][0], qb[nc][2 * i + 1][1]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int tok = chunk + 16 * u + 8 * r + gid;
        const bool valid = tile_pos + tok < pos_end;
        const float ks = k_scale[Cfg::scale_row(tok, h_local)];
        if constexpr (kLean) {
          lv[u][r] = __shfl_sync(0xffffffffu, lane_lv, 16 * u + 8 * r + gid);
        } else {
          lv[u][r] = valid ? __log2f(v_scale[Cfg::scale_row(tok, h_local)]) : -CUDART_INF_F;
        }
#pragma unroll
        for (int nc = 0; nc < NC; ++nc)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float s = sc[nc][u][2 * r + c] * ks * head_scale[nc][c];
            sc[nc][u][2 * r + c] = valid ? s : -CUDART_INF_F;
          }
      }
    }

    // ---- online softmax per head column over the warp's 32 tokens
    float beta[NC][2];
#pragma unroll
    for (int nc = 0; nc < NC; ++nc) beta[nc][0] = beta[nc][1] = 1.f;
    bool rescale = true;  // eager: every tile; lazy: only when a column's max grew by > kLazyLog2
    uint32_t pb[NC][2][2];  // P^T B fragments per 16-token block: b0 (tokens 2 tig, +1), b1 (8 + 2 tig, +1)
    {
      float mx[NC][2], Mx[NC][2];  // this lane's maxima of s and of s + log2 sv; the column's once rescaling
#pragma unroll
      for (int nc = 0; nc < NC; ++nc)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          mx[nc][c] = -FLT_MAX;
          Mx[nc][c] = -FLT_MAX;
#pragma unroll
          for (int u = 0; u < 2; ++u)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              mx[nc][c] = fmaxf(mx[nc][c], sc[nc][u][2 * r + c]);
              Mx[nc][c] = fmaxf(Mx[nc][c], sc[nc][u][2 * r + c] + lv[u][r]);
            }
        }
      if constexpr (kLean) {
        // The lanes' own maxima decide: run_m and run_M are the same in the 8 lanes of a column (column maxima), so
        // some lane's exceeds them by more than kLazyLog2 exactly when the column's does, and the common tile skips
        // the 12 shuffles of the column maxima.
        bool grew = mx[0][0] > run_m[0][0] + kLazyLog2 || mx[0][1] > run_m[0][1] + kLazyLog2 ||
                    Mx[0][0] > run_M[0][0] + kLazyLog2 || Mx[0][1] > run_M[0][1] + kLazyLog2;
#pragma unroll
        for (int nc = 1; nc < NC; ++nc)
          grew = grew || mx[nc][0] > run_m[nc][0] + kLazyLog2 || mx[nc][1] > run_m[nc][1] + kLazyLog2 ||
                 Mx[nc][0] > run_M[nc][0] + kLazyLog2 || Mx[nc][1] > run_M[nc][1] + kLazyLog2;
        rescale = __any_sync(0xffffffffu, grew);  // warp-uniform branch
      }
      if (rescale) {  // warp-uniform (eager: always; lazy: __any_sync), so every lane takes part in the shuffles
#pragma unroll
        for (int nc = 0; nc < NC; ++nc)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            mx[nc][c] = column_max(mx[nc][c]);
            Mx[nc][c] = column_max(Mx[nc][c]);
            const float m_new = fmaxf(run_m[nc][c], mx[nc][c]);
            const float M_new = fmaxf(run_M[nc][c], Mx[nc][c]);
            run_l[nc][c] *= fast_exp2(run_m[nc][c] - m_new);
            beta[nc][c] = fast_exp2(run_M[nc][c] - M_new);
            run_m[nc][c] = m_new;
            run_M[nc][c] = M_new;
          }
      }
#pragma unroll
      for (int nc = 0; nc < NC; ++nc) {
        float w[2][4];  // numerator weights 2^(s + log2 sv - M)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          float sum = 0.f;
#pragma unroll
          for (int u = 0; u < 2; ++u)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              sum += fast_exp2(sc[nc][u][2 * r + c] - run_m[nc][c]);
              w[u][2 * r + c] = fast_exp2(sc[nc][u][2 * r + c] + lv[u][r] - run_M[nc][c]);
            }
          run_l[nc][c] += sum;
        }
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          pb[nc][u][0] = movmatrix_trans(pack_f16x2(w[u][0], w[u][1]));  // token rows gid -> k 2 tig, 2 tig + 1
          pb[nc][u][1] = movmatrix_trans(pack_f16x2(w[u][2], w[u][3]));  // token rows gid + 8 -> k 8 + 2 tig, +1
        }
      }
    }
    if (rescale) {
#pragma unroll
      for (int nc = 0; nc < NC; ++nc)
#pragma unroll
        for (int j = 0; j < Cfg::kMTiles; ++j) {
          acc[nc][j][0] *= beta[nc][0];
          acc[nc][j][1] *= beta[nc][1];
          acc[nc][j][2] *= beta[nc][0];
          acc[nc][j][3] *= beta[nc][1];
        }
    }

    // ---- O^T += V^T P^T: thread gid owns d in [(D/8) gid, (D/8)(gid + 1)) of tokens 2 tig, 2 tig + 1,
    // 8 + 2 tig, 9 + 2 tig of each block; m-tile (word wi, pair j): row gid = element 2j of the word,
    // row gid + 8 = element 2j + 1; register halves = the two tokens of a pair.
    const int vblock = (gid * (D / 8)) / 16;
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int t0 = chunk + 16 * u + 2 * tig;
      const int vtok[4] = {t0, t0 + 1, t0 + 8, t0 + 9};
      uint32_t vscale[2];  // {b(tok 0), b(tok 1)}, {b(tok 2), b(tok 3)} as f16x2
#pragma unroll
      for (int pr = 0; pr < 2; ++pr) {
        const uint32_t lo = stage[Cfg::kOffVb + Cfg::scale_row(vtok[2 * pr], h_local) * Cfg::kScaleBytes + vblock];
        const uint32_t hi = stage[Cfg::kOffVb + Cfg::scale_row(vtok[2 * pr + 1], h_local) * Cfg::kScaleBytes + vblock];
        vscale[pr] = e4m3x2_to_f16x2(lo | (hi << 8));
      }
      uint32_t vw[4][Cfg::kVWords];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint8_t* row = stage + Cfg::kOffVc + Cfg::code_row(vtok[k], h_local) * Cfg::kCodeBytes + gid * (D / 16);
        if constexpr (Cfg::kVWords == 2) {
          const uint2 w2 = *reinterpret_cast<const uint2*>(row);
          vw[k][0] = w2.x; vw[k][1] = w2.y;
        } else {
          vw[k][0] = *reinterpret_cast<const uint32_t*>(row);
        }
      }
#pragma unroll
      for (int wi = 0; wi < Cfg::kVWords; ++wi) {
        // low lanes (elements 0, 2, 4, 6) and high lanes (1, 3, 5, 7) of two tokens' words -> one word
        // each, whose fields are f16x2 pairs of the two tokens: [token pair][even, odd][element pair j]
        uint32_t f[2][2][4];
#pragma unroll
        for (int pr = 0; pr < 2; ++pr) {
          kv_codes::fields(__byte_perm(vw[2 * pr][wi], vw[2 * pr + 1][wi], 0x5410u), f[pr][0]);
          kv_codes::fields(__byte_perm(vw[2 * pr][wi], vw[2 * pr + 1][wi], 0x7632u), f[pr][1]);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {  // m-tile: row gid = element 2j of the word, row gid + 8 = element 2j + 1
          const uint32_t a0 = hmul2(f[0][0][j], vscale[0]), a1 = hmul2(f[0][1][j], vscale[0]);
          const uint32_t a2 = hmul2(f[1][0][j], vscale[1]), a3 = hmul2(f[1][1][j], vscale[1]);
#pragma unroll
          for (int nc = 0; nc < NC; ++nc) mma_f16(acc[nc][wi * 4 + j], a0, a1, a2, a3, pb[nc][u][0], pb[nc][u][1]);
        }
      }
    }
    __syncthreads();  // the stage is refilled next iteration
  }
  if constexpr (!Cfg::kBulk) detail::cp_async_wait<0>();  // kBulk: every issued tile was waited for
  __syncthreads();
  CTA_STAMP(4);

  // ---- merge the warps: per head (m, l, M) and acc [8 heads][D], one column block of 8 heads at a time
  float* red = reinterpret_cast<float*>(smem);
  float* stats = red + Cfg::kWarps * 8 * D;  // [warps][3][8]
#pragma unroll
  for (int nc = 0; nc < NC; ++nc) {
    if (nc > 0) __syncthreads();  // the previous block's outputs have read red and stats
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const float l = column_sum(run_l[nc][c]);
      const int h = 2 * tig + c;
      if (gid == 0) {
        stats[(warp * 3 + 0) * 8 + h] = run_m[nc][c];
        stats[(warp * 3 + 1) * 8 + h] = l;
        stats[(warp * 3 + 2) * 8 + h] = run_M[nc][c];
      }
#pragma unroll
      for (int wi = 0; wi < Cfg::kVWords; ++wi)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int d = gid * (D / 8) + wi * 8 + 2 * j;
          red[(warp * 8 + h) * D + d] = acc[nc][wi * 4 + j][c];
          red[(warp * 8 + h) * D + d + 1] = acc[nc][wi * 4 + j][2 + c];
        }
    }
    __syncthreads();
    if (nc == 0) CTA_STAMP(6);
    // outputs (kv head hl of the CTA, q head h of this block's GB, kVec consecutive d): the kWarpsPerHead warps of
    // head hl merge. kVec elements per thread: 16-byte shared loads and stores, and the head's weights once per kVec.
    // One element per thread took 5.3 us per CTA on the H200 against 2.2 (docs/kv_cache.md, "A decode CTA's start and
    // end").
    constexpr int kVec = 8;  // store_split_output8
    const int GB = G - 8 * nc < 8 ? G - 8 * nc : 8;  // q heads of column block nc
    for (int idx = threadIdx.x; idx < Cfg::kKvHeadsPerCta * GB * D / kVec; idx += Cfg::kThreads) {
      const int hl = Cfg::kKvHeadsPerCta == 1 ? 0 : idx / (GB * D / kVec);
      const int h = (idx - hl * GB * D / kVec) / (D / kVec);
      const int d = kVec * (idx - hl * GB * D / kVec - h * (D / kVec));
      const int w0 = hl * Cfg::kWarpsPerHead;
      float m = -FLT_MAX, M = -FLT_MAX;
#pragma unroll
      for (int w = w0; w < w0 + Cfg::kWarpsPerHead; ++w) {
        m = fmaxf(m, stats[(w * 3 + 0) * 8 + h]);
        M = fmaxf(M, stats[(w * 3 + 2) * 8 + h]);
      }
      float l = 0.f, o[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) o[j] = 0.f;
#pragma unroll
      for (int w = w0; w < w0 + Cfg::kWarpsPerHead; ++w) {
        l += exp2f(stats[(w * 3 + 0) * 8 + h] - m) * stats[(w * 3 + 1) * 8 + h];
        const float weight = exp2f(stats[(w * 3 + 2) * 8 + h] - M);
#pragma unroll
        for (int q4 = 0; q4 < kVec / 4; ++q4) {
          const float4 r = *reinterpret_cast<const float4*>(red + (w * 8 + h) * D + d + 4 * q4);
          o[4 * q4 + 0] += weight * r.x;
          o[4 * q4 + 1] += weight * r.y;
          o[4 * q4 + 2] += weight * r.z;
          o[4 * q4 + 3] += weight * r.w;
        }
      }
      const float scale = exp2f(M - m);
#pragma unroll
      for (int j = 0; j < kVec; ++j) o[j] = l > 0.f ? kv_codes::kValueFold * o[j] * scale / l : 0.f;  // V / kValueFold
      const int out_head0 = Cfg::kKvHeadsPerCta == 1 ? head0 : hl * Cfg::GROUP + head_group * G;
      const int64_t bh = static_cast<int64_t>(b) * hq + out_head0 + 8 * nc + h;
      store_split_output8<D>(p, bh, d, split, num_splits, o, m, l);
    }
  }
  CTA_STAMP(5);
}

template <class Cfg>
__device__ __forceinline__ void decode_attention_mma2(const DecodeParams& p) {
  decode_attention_mma2_tiles<Cfg, load_tile_mma2<Cfg>, /*kLean=*/false>(p);
}

}  // namespace trace_kernels
