// The down GEMM's per-slot rows (router weight applied), written by its epilogue and summed in slot order by the
// combine: FP16 values scaled by a power of two per pair of columns (j, j + 8) of each 16-column block, plus that
// exponent as int8. In block b of a row, the pair j (0..7) is columns 16b + j and 16b + j + 8: the two values one lane
// of the wgmma accumulator holds for a token, so the epilogue encodes without any cross-lane work.
//   values    fp16 [M, H]      block b, position 2j + t: column 16b + j + 8t, divided by 2^s, rounded to nearest
//   exponents int8 [M, H / 2]  block b, position j: the pair's s
// 2.5 bytes per value against FP32's 4, for the GEMM to write and the combine to read; FP16's 11 significant bits keep
// the combined output within issue 4's error budget where BF16 rows (8 bits) do not (docs/moe_gemm.md, "Per-slot
// rows"). The exponent keeps every finite FP32 value in FP16's range. The same encoding as
// moe_slot_rows.encode_slot_rows, bit for bit: a row's bits depend on that row alone, so batch invariance holds.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace trace_kernels::moe::slot_rows {

constexpr int kBlock = 16;  // columns per block: one warp's 16 weight rows of the wgmma accumulator
constexpr int kPairs = 8;   // exponents per block

// s with amax * 2^-s in [2^14, 2^15) (FP16 holds it, rounding included), clamped so that 2^s and 2^-s are normal FP32
// numbers. amax_bits: the float bits of the pair's larger |value| (integer order = float order for non-negative
// floats, and a NaN's bits exceed every finite one's, as in the reference's amax).
__device__ __forceinline__ int exponent_for(uint32_t amax_bits) {
  const int biased = static_cast<int>((amax_bits >> 23) & 0xffu);
  return min(max(biased - 127 - 14, -126), 113);
}

__device__ __forceinline__ float pow2(int e) { return __uint_as_float(static_cast<uint32_t>(127 + e) << 23); }

// One stored pair as FP32 (exact: FP16 values times a normal power of two): word holds columns j and j + 8 of a
// block as two FP16 values, exponent_byte the pair's s (its low 8 bits, as int8).
__device__ __forceinline__ float2 decode_pair(uint32_t word, uint32_t exponent_byte) {
  const float scale = pow2(static_cast<int8_t>(exponent_byte & 0xffu));
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&word));
  return make_float2(f.x * scale, f.y * scale);
}

// Block b of row `row` in column order, as FP32 (exact: an FP16 value times a normal power of two).
// __ldcg: another CTA may have written it (the fused combine) after this SM's L1 saw the line.
template <int H>
__device__ __forceinline__ void load_block(const __half* values, const int8_t* exponents, int64_t row, int b,
                                           float (&out)[kBlock]) {
  const uint4* v = reinterpret_cast<const uint4*>(values + row * H + b * kBlock);
  const uint4 lo = __ldcg(v), hi = __ldcg(v + 1);  // pairs 0-3, 4-7
  const uint2 e = __ldcg(reinterpret_cast<const uint2*>(exponents + row * (H / 2) + b * kPairs));
  const uint32_t words[kPairs] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
  for (int j = 0; j < kPairs; ++j) {
    const float2 f = decode_pair(words[j], (j < 4 ? e.x : e.y) >> (8 * (j % 4)));
    out[j] = f.x;
    out[j + 8] = f.y;
  }
}

// out[16b .. 16b + 15] = bf16(sum_{j < TOPK} block b of row rows(j)), summed in FP32 in slot order.
template <int H, int TOPK, class Rows>
__device__ __forceinline__ void combine_block(const __half* values, const int8_t* exponents, Rows rows, int b,
                                              __nv_bfloat16* out) {
  float acc[kBlock], next[kBlock];
  load_block<H>(values, exponents, rows(0), b, acc);
#pragma unroll
  for (int j = 1; j < TOPK; ++j) {
    load_block<H>(values, exponents, rows(j), b, next);
#pragma unroll
    for (int c = 0; c < kBlock; ++c) acc[c] += next[c];
  }
  uint32_t packed[kBlock / 2];
#pragma unroll
  for (int c = 0; c < kBlock / 2; ++c) {
    const __nv_bfloat162 two = __floats2bfloat162_rn(acc[2 * c], acc[2 * c + 1]);
    packed[c] = *reinterpret_cast<const uint32_t*>(&two);
  }
  uint4* dst = reinterpret_cast<uint4*>(out + b * kBlock);
  dst[0] = {packed[0], packed[1], packed[2], packed[3]};
  dst[1] = {packed[4], packed[5], packed[6], packed[7]};
}

// Quarter q (pairs 2q and 2q + 1: columns 16b + 2q, + 1, + 8, + 9) of block b of a token's output, from its TOPK
// rows (rows[j]) summed in FP32 in slot order: combine_block's arithmetic per column, so the same bits. Every slot's
// loads are issued before the first sum (8 + 2 bytes per slot and quarter), so a token's TOPK rows cost one L2 round
// trip, where combine_block at the 64 registers of a decode tile chains them. The fused combine's unit of work: a
// decode tile's winning tokens give one quarter per thread.
template <int H, int TOPK>
__device__ __forceinline__ void combine_quarter(const __half* values, const int8_t* exponents, const int32_t (&rows)[TOPK],
                                                int b, int q, __nv_bfloat16* out) {
  uint2 v[TOPK];
  uint32_t e[TOPK];
#pragma unroll
  for (int j = 0; j < TOPK; ++j) {
    v[j] = __ldcg(reinterpret_cast<const uint2*>(values + rows[j] * static_cast<int64_t>(H) + b * kBlock + 4 * q));
    e[j] = __ldcg(reinterpret_cast<const unsigned short*>(exponents + rows[j] * static_cast<int64_t>(H / 2) +
                                                          b * kPairs + 2 * q));
  }
  float acc[4];  // columns 16b + 2q, 2q + 1, 2q + 8, 2q + 9
#pragma unroll
  for (int j = 0; j < TOPK; ++j) {
    const float2 f0 = decode_pair(v[j].x, e[j]), f1 = decode_pair(v[j].y, e[j] >> 8);  // pairs 2q, 2q + 1
    const float x[4] = {f0.x, f1.x, f0.y, f1.y};
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[c] = j == 0 ? x[c] : acc[c] + x[c];  // (slot 0 as loaded: -0 stays -0)
  }
  const __nv_bfloat162 lo = __floats2bfloat162_rn(acc[0], acc[1]), hi = __floats2bfloat162_rn(acc[2], acc[3]);
  *reinterpret_cast<__nv_bfloat162*>(out + b * kBlock + 2 * q) = lo;
  *reinterpret_cast<__nv_bfloat162*>(out + b * kBlock + 2 * q + 8) = hi;
}

// The RouterWeight epilogue's stores for one warp of the wgmma accumulator: accum(v0 + 2*v1 + 4*v2) is weight row
// warp_row0 + g + 8*v1 (g = lane / 4) and token 2*q + v0 + 8*v2 (q = lane % 4) of the token tile at row0; the row is
// accum * (token_scale[n] * scale_fold) * token_weight[n]. A lane's two rows of a token are one pair: it stores their
// FP16 values (4 bytes; the warp's 8 lanes of a token 32 contiguous bytes) and their exponent (1 byte; 8 contiguous),
// with one base address per lane and a constant offset per token.
template <int TN, int N, class Accum>
__device__ __forceinline__ void store_warp_rows(Accum accum, const float* token_scale, const float* token_weight,
                                                __half* values, int8_t* exponents, int warp_row0, int64_t row0,
                                                int rows_valid, int lane, float scale_fold) {
  const int g = lane / 4, q = lane % 4;
  const int64_t row_q = row0 + 2 * q;  // token n = 2q + dn
  uint32_t* pair_out = reinterpret_cast<uint32_t*>(values + row_q * N + warp_row0 + 2 * g);
  int8_t* exponent_out = exponents + row_q * (N / 2) + warp_row0 / 2 + g;
#pragma unroll
  for (int v2 = 0; v2 < TN / 8; ++v2) {
#pragma unroll
    for (int v0 = 0; v0 < 2; ++v0) {
      const int dn = v0 + 8 * v2;
      if (2 * q + dn >= rows_valid) continue;
      const float scale = token_scale[2 * q + dn] * scale_fold, weight = token_weight[2 * q + dn];
      const float y0 = accum(v0 + 4 * v2) * scale * weight;      // row warp_row0 + g
      const float y1 = accum(v0 + 2 + 4 * v2) * scale * weight;  // row warp_row0 + g + 8
      const int s = exponent_for(max(__float_as_uint(fabsf(y0)), __float_as_uint(fabsf(y1))));
      const float down = pow2(-s);
      const __half2 h = __floats2half2_rn(y0 * down, y1 * down);
      pair_out[dn * (N / 2)] = *reinterpret_cast<const uint32_t*>(&h);
      exponent_out[dn * (N / 2)] = static_cast<int8_t>(s);
    }
  }
}

}  // namespace trace_kernels::moe::slot_rows
