// KV gather: a layer's paged NVFP4 K and V -> contiguous dequantized K and V [B, S, Hkv, D] in
// bf16 / fp16 / fp32, the operands of prefill / extend attention (trace_kernels.kv_gather; the
// reference is kv_gather_reference). Every element is RN_out(value(code) * RN(float(b) * s)) computed in
// FP32, bit for bit nvfp4.dequantize(...).to(dtype), i.e. the values decode attention computes with;
// positions at or past a sequence's length are written as zeros and their page-table entries are
// never read (they may hold anything).
//
// Work split: a thread owns one 16-element block of one (sequence, position, kv head) row, so the
// D/16 threads of a row read its 8-byte code words and its block-scale bytes side by side and write
// its D outputs as one contiguous run. Each thread takes ITEMS blocks CTA threads apart and issues
// all their loads before it converts and stores any of them (ITEMS = 1, the default, was the fastest).
// blockIdx.y picks K (0) or V (1).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "trace_kernels/kv_codes.cuh"
#include "trace_kernels/kv_pages.cuh"
#include "trace_kernels/nvfp4.cuh"
#include "trace_kernels/vec.cuh"

namespace trace_kernels {

template <int D_, int HKV_, int CTA_, int ITEMS_>
struct KvGatherConfig {
  static constexpr int D = D_;
  static constexpr int HKV = HKV_;
  static constexpr int CTA = CTA_;
  static constexpr int ITEMS = ITEMS_;
  static constexpr int kBlocks = D / nvfp4::kBlock;  // threads per row
  static_assert(D % nvfp4::kBlock == 0, "D must be a multiple of 16");
  static_assert(CTA % 32 == 0 && CTA <= 1024, "CTA must hold whole warps");
};

// The 16 values of one block from its two stored code words (kv_codes layout) and its step b * s.
__device__ __forceinline__ void dequantize_block(uint2 words, float step, float (&out)[16]) {
#pragma unroll
  for (int w = 0; w < 2; ++w) {
    uint32_t f[4];
    kv_codes::fields(w == 0 ? words.x : words.y, f);  // FP16 pairs value / 2^14
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 v = __half22float2(*reinterpret_cast<const __half2*>(&f[j]));
      // value(code) exactly (the fold is a power of two), times the step rounded once, as the reference
      out[8 * w + 2 * j] = __fmul_rn(v.x * kv_codes::kValueFold, step);
      out[8 * w + 2 * j + 1] = __fmul_rn(v.y * kv_codes::kValueFold, step);
    }
  }
}

// positions = S; blocks = B * S * HKV * D / 16. out: [B, S, HKV, D].
template <class Cfg, class Out>
__device__ __forceinline__ void kv_gather_nvfp4(const Nvfp4PagePtrs pages, const int* __restrict__ block_table,
                                                const int* __restrict__ lengths, int max_pages, int page_size,
                                                int positions, int64_t blocks, Out* __restrict__ out) {
  uint2 words[Cfg::ITEMS];
  uint8_t scale_bits[Cfg::ITEMS];
  float row_scale[Cfg::ITEMS];
  bool valid[Cfg::ITEMS];
  const int64_t first = static_cast<int64_t>(blockIdx.x) * Cfg::ITEMS * Cfg::CTA + threadIdx.x;
#pragma unroll
  for (int it = 0; it < Cfg::ITEMS; ++it) {
    const int64_t i = first + it * Cfg::CTA;
    valid[it] = false;
    if (i < blocks) {
      const int j = static_cast<int>(i % Cfg::kBlocks);
      const int64_t row = i / Cfg::kBlocks;  // (b * S + pos) * HKV + h
      const int h = static_cast<int>(row % Cfg::HKV);
      const int64_t seq_pos = row / Cfg::HKV;
      const int b = static_cast<int>(seq_pos / positions), pos = static_cast<int>(seq_pos % positions);
      if (pos < __ldg(lengths + b)) {
        const int page = __ldg(block_table + static_cast<int64_t>(b) * max_pages + pos / page_size);
        const int64_t src = (static_cast<int64_t>(page) * page_size + pos % page_size) * Cfg::HKV + h;
        words[it] = __ldg(reinterpret_cast<const uint2*>(pages.codes + src * (Cfg::D / 2)) + j);
        scale_bits[it] = __ldg(pages.block_scales + src * Cfg::kBlocks + j);
        row_scale[it] = __ldg(pages.scale + src);
        valid[it] = true;
      }
    }
  }
#pragma unroll
  for (int it = 0; it < Cfg::ITEMS; ++it) {
    const int64_t i = first + it * Cfg::CTA;
    if (i >= blocks) break;
    float v[16];
    if (valid[it]) {
      dequantize_block(words[it], __fmul_rn(nvfp4::e4m3_to_float(scale_bits[it]), row_scale[it]), v);
    } else {
#pragma unroll
      for (int e = 0; e < 16; ++e) v[e] = 0.f;
    }
    Out* dst = out + i * nvfp4::kBlock;  // blocks are laid out in output order
    store8(dst, *reinterpret_cast<const float(*)[8]>(&v[0]));
    store8(dst + 8, *reinterpret_cast<const float(*)[8]>(&v[8]));
  }
}

}  // namespace trace_kernels
