// Paged split-KV decode attention over NVFP4 pages on the tensor cores (mma.sync m16n8k16, FP16
// operands, FP32 accumulation). Same inputs, outputs, tiling and cp.async pipeline as
// attention_decode.cuh; only the math of a tile differs.
//
// Why: with 8 q heads per kv head, QK and PV cost 2 x 8 x D multiply-adds per token and kv head,
// more than the CUDA cores can issue at the speed the 4.75-bit pages stream in. Here each warp takes
// 16 tokens of a tile and runs them through MMAs with the q heads as the M rows (up to 16):
//   scores S[h, tok] = Q[h, :] . K[tok, :]  (A = Q in registers, B = K dequantized in registers)
//   O[h, :] += P[h, tok] V[tok, :]           (A = P straight from the score fragment, B = V)
// Operands are exact: E2M1 code x E4M3 block scale fits FP16 (<= 6 significant bits, 2^-10..2688),
// built with the e4m3x2 -> f16x2 instruction (nibble bits placed in an E4M3 byte = value / 64) and
// one HMUL2 by 64 b; q is scaled per head by a power of two into FP16's range (BF16 -> FP16 is then
// exact for all but elements 2^29 below the head's max). The FP32 row scale of K multiplies the
// score; the row scale of V enters as log2(s_v) added to the score of the numerator (a second
// running max), so P stays in [0, 1] in FP16 and no per-token scale touches V:
//   o = 2^(M - m) * sum_t 2^(s_t + log2 sv_t - M) v_t / sum_t 2^(s_t - m).
// Within a CTA each warp keeps its own (m, l, M, acc) over its tokens; the 4 warps merge at the end.
// The reduction dimension of both MMAs is permuted (each thread's operands come from contiguous
// bytes); both operands use the same permutation, and output columns are written back in place.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <math_constants.h>
#include <stdint.h>

#include "trace_kernels/attention_decode.cuh"

namespace trace_kernels {

template <int D_, int HKV_, int GROUP_, int HEADS_PER_CTA_, int PAGE_, int STAGES_>
struct DecodeAttentionMmaConfig : KvStageLayout</*TT=*/64, D_ / 2, D_ / 16, 4> {
  static constexpr bool kNvfp4 = true;
  static constexpr int D = D_;
  static constexpr int HKV = HKV_;
  static constexpr int GROUP = GROUP_;
  static constexpr int G = HEADS_PER_CTA_;  // MMA rows used (<= 16)
  static constexpr int kHeadGroups = GROUP / G;
  static constexpr int P = PAGE_;
  static constexpr int TT = 64;  // 4 warps x 16 tokens
  static constexpr int STAGES = STAGES_;
  static constexpr int kThreads = 128;
  static constexpr int kWarps = 4;
  static constexpr int kCodeBytes = D / 2;
  static constexpr int kScaleBytes = D / 16;
  static constexpr int kStageBytes = DecodeAttentionMmaConfig::kLayoutBytes;  // offsets: KvStageLayout
  static constexpr int kKWords = D / 32;       // QK: 32-bit code words per thread per token (region D/4)
  static constexpr int kKSteps = D / 16;       // QK MMA k-steps
  static constexpr int kNTiles = D / 8;        // PV MMA n-tiles
  static constexpr int kVWords = D / 64;       // PV: code words per thread per token (D/8 elements)
  static constexpr int kReduceFloats = kWarps * (16 * D + 3 * 16);  // acc + (m, l, M) per warp
  static constexpr int kSmemBytes = STAGES * kStageBytes > kReduceFloats * 4 ? STAGES * kStageBytes : kReduceFloats * 4;
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  static_assert(G >= 1 && G <= 16 && GROUP % G == 0, "up to 16 q heads per CTA");
  static_assert(kSmemBytes <= 48 * 1024, "static shared memory limit");
};

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

template <class Cfg>
__device__ __forceinline__ void decode_attention_mma(const DecodeParams& p) {
  using namespace mma_detail;
  constexpr int D = Cfg::D, G = Cfg::G, TT = Cfg::TT;
  __shared__ __align__(16) uint8_t smem[Cfg::kSmemBytes];

  const int kv_head = blockIdx.x / Cfg::kHeadGroups;
  const int head0 = kv_head * Cfg::GROUP + (blockIdx.x % Cfg::kHeadGroups) * G;
  const DecodeCta cta = decode_cta(p);
  const int split = cta.split;
  const int num_splits = gridDim.y;
  const int b = cta.b;
  const int hq = Cfg::HKV * Cfg::GROUP;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int gid = lane / 4;  // MMA group id: row (head) gid and gid + 8; B column
  const int tig = lane % 4;  // thread in group

  const SplitRange range = split_range<Cfg>(p, b, split);
  const int pos_begin = range.pos_begin, pos_end = range.pos_end, num_tiles = range.num_tiles;

  // Q as MMA A fragments, scaled per head by a power of two c into FP16 range. Rows: heads gid and
  // gid + 8 (zero beyond G). Thread tig owns elements [tig * D/4, (tig + 1) * D/4) of D; k-step
  // s = 2 i + h takes word i's elements {4h, 4h+2} (k = 2t, 2t+1) and {4h+1, 4h+3} (k = 2t+8, 2t+9).
  uint32_t qa[Cfg::kKSteps][4];
  float score_scale[2];  // softmax_scale * log2(e) / c per row
  {
    float qv[2][D / 4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int h = gid + 8 * r;
      float amax = 0.f;
#pragma unroll
      for (int v = 0; v < D / 32; ++v) {
        float f[8];
        if (h < G) {
          const uint4 raw = *reinterpret_cast<const uint4*>(p.q + (static_cast<int64_t>(b) * hq + head0 + h) * D +
                                                            tig * (D / 4) + v * 8);
          detail::bf16x8_to_float(raw, f);
        } else {
#pragma unroll
          for (int j = 0; j < 8; ++j) f[j] = 0.f;
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          qv[r][v * 8 + j] = f[j];
          amax = fmaxf(amax, fabsf(f[j]));
        }
      }
      amax = quad_max(amax);
      int e = 0;
      frexpf(amax, &e);  // amax = m 2^e, m in [0.5, 1)
      const int shift = amax > 0.f ? max(-126, min(127, 15 - e)) : 0;  // amax * 2^shift in [2^14, 2^15)
      const float c = ldexpf(1.f, shift);
      score_scale[r] = p.scale_log2 * ldexpf(1.f, -shift);
#pragma unroll
      for (int j = 0; j < D / 4; ++j) qv[r][j] *= c;
    }
#pragma unroll
    for (int s = 0; s < Cfg::kKSteps; ++s) {
      const int base = (s / 2) * 8 + (s % 2) * 4;
      qa[s][0] = pack_f16x2(qv[0][base], qv[0][base + 2]);
      qa[s][1] = pack_f16x2(qv[1][base], qv[1][base + 2]);
      qa[s][2] = pack_f16x2(qv[0][base + 1], qv[0][base + 3]);
      qa[s][3] = pack_f16x2(qv[1][base + 1], qv[1][base + 3]);
    }
  }

  float acc[Cfg::kNTiles][4];
#pragma unroll
  for (int j = 0; j < Cfg::kNTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  float run_m[2] = {-CUDART_INF_F, -CUDART_INF_F};  // max score (log2 domain) per row
  float run_M[2] = {-CUDART_INF_F, -CUDART_INF_F};  // max of score + log2(s_v)
  float run_l[2] = {0.f, 0.f};                      // this thread's part of sum 2^(score - m)

  pipeline_prefetch<Cfg, load_tile<Cfg>>(smem, p, b, kv_head, range);

  for (int tile = 0; tile < num_tiles; ++tile) {
    const uint8_t* stage = pipeline_next_stage<Cfg, load_tile<Cfg>>(smem, p, b, kv_head, range, tile);
    const float* k_scale = reinterpret_cast<const float*>(stage + Cfg::kOffKs);
    const float* v_scale = reinterpret_cast<const float*>(stage + Cfg::kOffVs);
    const int chunk = warp * 16;  // this warp's 16 tokens of the tile

    // ---- scores: two n-tiles of 8 tokens; B column gid = token chunk + 8 nt + gid
    float sc[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
      const int tok = chunk + nt * 8 + gid;
      const uint8_t* row = stage + Cfg::kOffKc + tok * Cfg::kCodeBytes + tig * (D / 8);
      uint32_t words[Cfg::kKWords];
      if constexpr (Cfg::kKWords == 4) {
        const uint4 w4 = *reinterpret_cast<const uint4*>(row);
        words[0] = w4.x; words[1] = w4.y; words[2] = w4.z; words[3] = w4.w;
      } else {
        const uint2 w2 = *reinterpret_cast<const uint2*>(row);
        words[0] = w2.x; words[1] = w2.y;
      }
#pragma unroll
      for (int i = 0; i < Cfg::kKWords; ++i) {
        const int block = (tig * (D / 4) + i * 8) / 16;
        const float b64 = 64.f * nvfp4::e4m3_to_float(stage[Cfg::kOffKb + tok * Cfg::kScaleBytes + block]);
        const uint32_t scale2 = pack_f16x2(b64, b64);
        const uint32_t nib = kv_codes::nibbles(words[i]);  // the cache layout -> nibbles
        const uint32_t ev = even_bytes(nib), od = odd_bytes(nib);
        const uint32_t e_lo = hmul2(e4m3x2_to_f16x2(ev & 0xFFFFu), scale2);  // elements 0, 2
        const uint32_t e_hi = hmul2(e4m3x2_to_f16x2(ev >> 16), scale2);      // 4, 6
        const uint32_t o_lo = hmul2(e4m3x2_to_f16x2(od & 0xFFFFu), scale2);  // 1, 3
        const uint32_t o_hi = hmul2(e4m3x2_to_f16x2(od >> 16), scale2);      // 5, 7
        mma_f16(sc[nt], qa[2 * i][0], qa[2 * i][1], qa[2 * i][2], qa[2 * i][3], e_lo, o_lo);
        mma_f16(sc[nt], qa[2 * i + 1][0], qa[2 * i + 1][1], qa[2 * i + 1][2], qa[2 * i + 1][3], e_hi, o_hi);
      }
    }

    // ---- online softmax per row (head gid: c0, c1; head gid + 8: c2, c3); columns 8 nt + 2 tig + {0, 1}
    float a[2][4];  // score + log2(s_v)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int tok = chunk + nt * 8 + 2 * tig + (c & 1);
        const bool valid = pos_begin + tile * TT + tok < pos_end;
        const float s = sc[nt][c] * k_scale[tok] * score_scale[c / 2];
        sc[nt][c] = valid ? s : -CUDART_INF_F;
        a[nt][c] = valid ? s + log2f(v_scale[tok]) : -CUDART_INF_F;
      }
    }
    float alpha[2], beta[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(run_m[r], quad_max(fmaxf(fmaxf(sc[0][2 * r], sc[0][2 * r + 1]),
                                                         fmaxf(sc[1][2 * r], sc[1][2 * r + 1]))));
      const float M_new = fmaxf(run_M[r], quad_max(fmaxf(fmaxf(a[0][2 * r], a[0][2 * r + 1]),
                                                         fmaxf(a[1][2 * r], a[1][2 * r + 1]))));
      alpha[r] = run_m[r] == -CUDART_INF_F ? 1.f : exp2f(run_m[r] - m_new);  // run_l is 0 while m is -inf
      beta[r] = run_M[r] == -CUDART_INF_F ? 1.f : exp2f(run_M[r] - M_new);
      run_m[r] = m_new;
      run_M[r] = M_new;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          sum += exp2_shifted(sc[nt][2 * r + c], m_new);
          a[nt][2 * r + c] = exp2_shifted(a[nt][2 * r + c], M_new);  // numerator weight in [0, 1]
        }
      run_l[r] = run_l[r] * alpha[r] + sum;
    }
#pragma unroll
    for (int j = 0; j < Cfg::kNTiles; ++j) {
      acc[j][0] *= beta[0];
      acc[j][1] *= beta[0];
      acc[j][2] *= beta[1];
      acc[j][3] *= beta[1];
    }

    // ---- P.V: A = the weights (k = token 2 tig, 2 tig + 1 of n-tile 0, then of n-tile 1)
    const uint32_t pa0 = pack_f16x2(a[0][0], a[0][1]);  // row gid,     tokens 2t, 2t+1
    const uint32_t pa1 = pack_f16x2(a[0][2], a[0][3]);  // row gid + 8
    const uint32_t pa2 = pack_f16x2(a[1][0], a[1][1]);  // row gid,     tokens 8 + 2t, 9 + 2t
    const uint32_t pa3 = pack_f16x2(a[1][2], a[1][3]);  // row gid + 8
    // B: k rows = tokens {2t, 2t+1} (b0) and {8 + 2t, 9 + 2t} (b1); column gid of n-tile j is
    // element (D/8) gid + j, so the thread reads D/8 contiguous elements of each of its 4 tokens.
    const int vtok[4] = {chunk + 2 * tig, chunk + 2 * tig + 1, chunk + 8 + 2 * tig, chunk + 9 + 2 * tig};
    const int vblock = (gid * (D / 8)) / 16;
    uint32_t vscale[2];  // {b(tok 0) * 64, b(tok 1) * 64} and for tokens 2, 3
#pragma unroll
    for (int pr = 0; pr < 2; ++pr)
      vscale[pr] = pack_f16x2(64.f * nvfp4::e4m3_to_float(stage[Cfg::kOffVb + vtok[2 * pr] * Cfg::kScaleBytes + vblock]),
                              64.f * nvfp4::e4m3_to_float(stage[Cfg::kOffVb + vtok[2 * pr + 1] * Cfg::kScaleBytes + vblock]));
#pragma unroll
    for (int wi = 0; wi < Cfg::kVWords; ++wi) {
      uint32_t ev[4], od[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t w = *reinterpret_cast<const uint32_t*>(stage + Cfg::kOffVc + vtok[k] * Cfg::kCodeBytes +
                                                               gid * (D / 16) + wi * 4);
        const uint32_t nib = kv_codes::nibbles(w);  // the cache layout -> nibbles
        ev[k] = even_bytes(nib);
        od[k] = odd_bytes(nib);
      }
      // pairs across the two tokens of b0 (k = 0, 1) and of b1 (k = 2, 3), nibble n of the word:
      // prmt 0x5140 -> {tok a n0, tok b n0, tok a n2, tok b n2} for even bytes 0, 1 (nibbles 0, 2)
#pragma unroll
      for (int half = 0; half < 2; ++half) {  // even/odd nibbles
        const uint32_t* src = half == 0 ? ev : od;
#pragma unroll
        for (int sel = 0; sel < 2; ++sel) {  // bytes 0, 1 or 2, 3 of the E/O words
          const uint32_t selector = sel == 0 ? 0x5140u : 0x7362u;
          const uint32_t x01 = __byte_perm(src[0], src[1], selector);  // b0 pairs, two nibbles
          const uint32_t x23 = __byte_perm(src[2], src[3], selector);  // b1 pairs
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const int nibble = 4 * sel + 2 * q + half;  // nibble within the word
            const int j = wi * 8 + nibble;              // n-tile
            const uint32_t b0 = hmul2(e4m3x2_to_f16x2(q == 0 ? (x01 & 0xFFFFu) : (x01 >> 16)), vscale[0]);
            const uint32_t b1 = hmul2(e4m3x2_to_f16x2(q == 0 ? (x23 & 0xFFFFu) : (x23 >> 16)), vscale[1]);
            mma_f16(acc[j], pa0, pa1, pa2, pa3, b0, b1);
          }
        }
      }
    }
    __syncthreads();  // the stage is refilled next iteration
  }
  detail::cp_async_wait<0>();
  __syncthreads();

  // ---- merge the 4 warps: per row (m, l, M) and acc
  float* red = reinterpret_cast<float*>(smem);
  float* stats = red + Cfg::kWarps * 16 * D;  // [warps][3][16]
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = quad_sum(run_l[r]);
    const int row = gid + 8 * r;
    if (tig == 0) {
      stats[(warp * 3 + 0) * 16 + row] = run_m[r];
      stats[(warp * 3 + 1) * 16 + row] = l;
      stats[(warp * 3 + 2) * 16 + row] = run_M[r];
    }
#pragma unroll
    for (int j = 0; j < Cfg::kNTiles; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int col = 2 * tig + c;
        red[(warp * 16 + row) * D + (D / 8) * col + j] = acc[j][2 * r + c];
      }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * D; idx += Cfg::kThreads) {
    const int h = idx / D;
    const int d = idx - h * D;
    float m = -CUDART_INF_F, M = -CUDART_INF_F;
#pragma unroll
    for (int w = 0; w < Cfg::kWarps; ++w) {
      m = fmaxf(m, stats[(w * 3 + 0) * 16 + h]);
      M = fmaxf(M, stats[(w * 3 + 2) * 16 + h]);
    }
    float l = 0.f, o = 0.f;
#pragma unroll
    for (int w = 0; w < Cfg::kWarps; ++w) {
      l += exp2_shifted(stats[(w * 3 + 0) * 16 + h], m) * stats[(w * 3 + 1) * 16 + h];
      o += exp2_shifted(stats[(w * 3 + 2) * 16 + h], M) * red[(w * 16 + h) * D + d];
    }
    o = l > 0.f ? o * exp2f(M - m) / l : 0.f;
    const int64_t bh = static_cast<int64_t>(b) * hq + head0 + h;
    store_split_output<D>(p, bh, d, split, num_splits, o, m, l);
  }
  combine_splits_in_kernel<D, Cfg::kThreads, Cfg::kSmemBytes / 4>(p, b, hq, G, [&](int r) { return head0 + r; },
                                                                   reinterpret_cast<float*>(smem));
}

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
  const DecodeCta cta = decode_cta(p);
  const int split = cta.split;
  const int num_splits = gridDim.y;
  const int b = cta.b;
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
  combine_splits_in_kernel<D, Cfg::kThreads, Cfg::kSmemBytes / 4>(p, b, hq, G, [&](int r) { return head0 + r; },
                                                                   reinterpret_cast<float*>(smem));
}

}  // namespace trace_kernels
