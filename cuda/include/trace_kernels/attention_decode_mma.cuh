// Paged split-KV decode attention on the tensor cores (mma.sync m16n8k16, FP32 accumulation): the MMA helpers the
// NVFP4 kernels share (attention_decode_mma2.cuh, attention_decode_mma4.cuh) and the BF16-page kernel ("mma").
//
// NVFP4 operands are exact in FP16: E2M1 code x E4M3 block scale has <= 6 significant bits in 2^-10..2688. They are
// built with the e4m3x2 -> f16x2 instruction (the nibble's bits placed in an E4M3 byte = value / 64) and one HMUL2 by
// 64 b. (An NVFP4 kernel with the q heads as MMA rows lost to mma2's tokens as rows and was removed on 2026-12-05.)
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math_constants.h>
#include <stdint.h>

#include "trace_kernels/attention_decode.cuh"

namespace trace_kernels {

namespace mma_detail {

__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t two_bytes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_bytes), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
  return *reinterpret_cast<uint32_t*>(&r);
}

__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// E4M3 bytes holding the nibble bits of 8 codes (value / 64): even elements 0,2,4,6 / odd 1,3,5,7.
__device__ __forceinline__ uint32_t even_bytes(uint32_t w) { return ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u); }
__device__ __forceinline__ uint32_t odd_bytes(uint32_t w) { return ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u); }

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// 2^(x - m) with -inf handling: 0 when x is -inf, and when m is -inf (nothing seen yet).
__device__ __forceinline__ float exp2_shifted(float x, float m) { return m == -CUDART_INF_F ? 0.f : exp2f(x - m); }

}  // namespace mma_detail

}  // namespace trace_kernels

// ------------------------------------------------------------------------------------------------
// BF16 pages on the tensor cores (mma.sync m16n8k16, BF16 operands straight from shared memory, FP32
// accumulation). Two warps of 16 tokens per 32-token tile, 3 stages of 16 KB (D = 128). Operands:
// K pairs are adjacent elements of a token; V pairs are one element of two tokens (one byte_perm);
// P is rounded to BF16 (as in FlashAttention-2). One running max per row.
// ------------------------------------------------------------------------------------------------
namespace trace_kernels {

template <int D_, int HKV_, int GROUP_, int HEADS_PER_CTA_, int PAGE_, int STAGES_>
struct DecodeAttentionMmaBf16Config {
  static constexpr bool kNvfp4 = false;
  static constexpr int D = D_;
  static constexpr int HKV = HKV_;
  static constexpr int GROUP = GROUP_;
  static constexpr int G = HEADS_PER_CTA_;
  static constexpr int kHeadGroups = GROUP / G;
  static constexpr int P = PAGE_;
  static constexpr int kWarps = 2;
  static constexpr int TT = 16 * kWarps;
  static constexpr int STAGES = STAGES_;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kCodeBytes = 2 * D;
  static constexpr int kScaleBytes = 0;
  static constexpr int kOffKc = 0;
  static constexpr int kOffVc = TT * kCodeBytes;
  static constexpr int kOffKb = 2 * TT * kCodeBytes;
  static constexpr int kOffVb = kOffKb, kOffKs = kOffKb, kOffVs = kOffKb;
  static constexpr int kStageBytes = 2 * TT * kCodeBytes;
  static constexpr int kKSteps = D / 16;
  static constexpr int kNTiles = D / 8;
  static constexpr int kReduceFloats = kWarps * (16 * D + 2 * 16);
  static constexpr int kSmemBytes = STAGES * kStageBytes > kReduceFloats * 4 ? STAGES * kStageBytes : kReduceFloats * 4;
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(G >= 1 && G <= 16 && GROUP % G == 0, "up to 16 q heads per CTA");
  static_assert(kSmemBytes <= 48 * 1024, "static shared memory limit");
};

namespace mma_detail {

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

}  // namespace mma_detail

template <class Cfg>
__device__ __forceinline__ void decode_attention_mma_bf16(const DecodeParams& p) {
  using namespace mma_detail;
  constexpr int D = Cfg::D, G = Cfg::G, TT = Cfg::TT;
  __shared__ __align__(16) uint8_t smem[Cfg::kSmemBytes];

  const int kv_head = blockIdx.x / Cfg::kHeadGroups;
  const int head0 = kv_head * Cfg::GROUP + (blockIdx.x % Cfg::kHeadGroups) * G;
  const int split = blockIdx.y;
  const int num_splits = gridDim.y;
  const int b = blockIdx.z;
  const int hq = Cfg::HKV * Cfg::GROUP;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int gid = lane / 4;
  const int tig = lane % 4;

  const SplitRange range = split_range<Cfg>(p, b, split);
  const int pos_begin = range.pos_begin, pos_end = range.pos_end, num_tiles = range.num_tiles;

  // Q A fragments: thread tig owns elements [tig D/4, (tig + 1) D/4); k-step s = 2 i + h takes
  // elements {8i + 4h, +1} (k = 2t, 2t+1) and {8i + 4h + 2, +3} (k = 2t+8, 2t+9): bf16 pairs as stored.
  uint32_t qa[Cfg::kKSteps][4];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = gid + 8 * r;
    const uint32_t* qrow = reinterpret_cast<const uint32_t*>(p.q + (static_cast<int64_t>(b) * hq + head0 + h) * D +
                                                             tig * (D / 4));
#pragma unroll
    for (int s = 0; s < Cfg::kKSteps; ++s) {
      const int e = (s / 2) * 8 + (s % 2) * 4;
      qa[s][r] = h < G ? qrow[e / 2] : 0u;
      qa[s][2 + r] = h < G ? qrow[e / 2 + 1] : 0u;
    }
  }
  const float scale = p.scale_log2;

  float acc[Cfg::kNTiles][4];
#pragma unroll
  for (int j = 0; j < Cfg::kNTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  float run_m[2] = {-CUDART_INF_F, -CUDART_INF_F};
  float run_l[2] = {0.f, 0.f};

  pipeline_prefetch<Cfg, load_tile<Cfg>>(smem, p, b, kv_head, range);

  for (int tile = 0; tile < num_tiles; ++tile) {
    const uint8_t* stage = pipeline_next_stage<Cfg, load_tile<Cfg>>(smem, p, b, kv_head, range, tile);
    const int chunk = warp * 16;

    float sc[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
      const uint4* row = reinterpret_cast<const uint4*>(stage + Cfg::kOffKc + (chunk + nt * 8 + gid) * Cfg::kCodeBytes +
                                                        tig * (D / 2));
#pragma unroll
      for (int i = 0; i < D / 32; ++i) {
        const uint4 w = row[i];  // elements 8i .. 8i+7 of the thread's region
        mma_bf16(sc[nt], qa[2 * i][0], qa[2 * i][1], qa[2 * i][2], qa[2 * i][3], w.x, w.y);
        mma_bf16(sc[nt], qa[2 * i + 1][0], qa[2 * i + 1][1], qa[2 * i + 1][2], qa[2 * i + 1][3], w.z, w.w);
      }
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int tok = chunk + nt * 8 + 2 * tig + (c & 1);
        sc[nt][c] = pos_begin + tile * TT + tok < pos_end ? sc[nt][c] * scale : -CUDART_INF_F;
      }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(run_m[r], quad_max(fmaxf(fmaxf(sc[0][2 * r], sc[0][2 * r + 1]),
                                                         fmaxf(sc[1][2 * r], sc[1][2 * r + 1]))));
      alpha[r] = run_m[r] == -CUDART_INF_F ? 1.f : exp2f(run_m[r] - m_new);
      run_m[r] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          sc[nt][2 * r + c] = exp2_shifted(sc[nt][2 * r + c], m_new);
          sum += sc[nt][2 * r + c];
        }
      run_l[r] = run_l[r] * alpha[r] + sum;
    }
#pragma unroll
    for (int j = 0; j < Cfg::kNTiles; ++j) {
      acc[j][0] *= alpha[0];
      acc[j][1] *= alpha[0];
      acc[j][2] *= alpha[1];
      acc[j][3] *= alpha[1];
    }
    const uint32_t pa0 = pack_bf16x2(sc[0][0], sc[0][1]);
    const uint32_t pa1 = pack_bf16x2(sc[0][2], sc[0][3]);
    const uint32_t pa2 = pack_bf16x2(sc[1][0], sc[1][1]);
    const uint32_t pa3 = pack_bf16x2(sc[1][2], sc[1][3]);
    // V: column gid of n-tile j is element (D/8) gid + j; tokens 2t, 2t+1 (b0) and 8+2t, 9+2t (b1)
    const int vtok[4] = {chunk + 2 * tig, chunk + 2 * tig + 1, chunk + 8 + 2 * tig, chunk + 9 + 2 * tig};
#pragma unroll
    for (int c16 = 0; c16 < D / 64; ++c16) {  // 16-byte chunks: 8 elements of the thread's D/8
      uint4 v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k)
        v[k] = *reinterpret_cast<const uint4*>(stage + Cfg::kOffVc + vtok[k] * Cfg::kCodeBytes + gid * (D / 4) + c16 * 16);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int j = c16 * 8 + e;
        const uint32_t sel = (e & 1) ? 0x7632u : 0x5410u;  // high or low bf16 of the word
        const uint32_t w[4] = {(&v[0].x)[e / 2], (&v[1].x)[e / 2], (&v[2].x)[e / 2], (&v[3].x)[e / 2]};
        mma_bf16(acc[j], pa0, pa1, pa2, pa3, __byte_perm(w[0], w[1], sel), __byte_perm(w[2], w[3], sel));
      }
    }
    __syncthreads();
  }
  detail::cp_async_wait<0>();
  __syncthreads();

  float* red = reinterpret_cast<float*>(smem);
  float* stats = red + Cfg::kWarps * 16 * D;  // [warps][2][16]
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = quad_sum(run_l[r]);
    const int row = gid + 8 * r;
    if (tig == 0) {
      stats[(warp * 2 + 0) * 16 + row] = run_m[r];
      stats[(warp * 2 + 1) * 16 + row] = l;
    }
#pragma unroll
    for (int j = 0; j < Cfg::kNTiles; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) red[(warp * 16 + row) * D + (D / 8) * (2 * tig + c) + j] = acc[j][2 * r + c];
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * D; idx += Cfg::kThreads) {
    const int h = idx / D;
    const int d = idx - h * D;
    float m = -CUDART_INF_F;
#pragma unroll
    for (int w = 0; w < Cfg::kWarps; ++w) m = fmaxf(m, stats[(w * 2) * 16 + h]);
    float l = 0.f, o = 0.f;
#pragma unroll
    for (int w = 0; w < Cfg::kWarps; ++w) {
      const float weight = exp2_shifted(stats[(w * 2) * 16 + h], m);
      l += weight * stats[(w * 2 + 1) * 16 + h];
      o += weight * red[(w * 16 + h) * D + d];
    }
    o = l > 0.f ? o / l : 0.f;
    const int64_t bh = static_cast<int64_t>(b) * hq + head0 + h;
    store_split_output<D>(p, bh, d, split, num_splits, o, m, l);
  }
}

}  // namespace trace_kernels
