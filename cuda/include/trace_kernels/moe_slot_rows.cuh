// The down GEMM's per-slot rows (router weight applied), written by its epilogue and summed in slot order by the
// combine: FP16 values scaled by a power of two per (row, 16 columns), plus that exponent as int8.
//   values    fp16 [M, H]       row / 2^s, rounded to nearest
//   exponents int8 [M, H / 16]  s of each 16-column block
// Half the bytes of FP32 rows for the combine to read (and the GEMM to write); FP16's 11 significant bits keep the
// combined output within issue 4's error budget where BF16 rows (8 bits) do not (docs/moe_gemm.md, "Per-slot rows").
// The exponent keeps every finite FP32 value in FP16's range. The same encoding as moe_gemm_ref.encode_slot_rows,
// bit for bit: a row's bits depend on that row alone, so batch invariance holds.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>

namespace trace_kernels::moe::slot_rows {

constexpr int kBlock = 16;  // columns per exponent: one warp's 16 weight rows of the wgmma accumulator

// s with amax * 2^-s in [2^14, 2^15) (FP16 holds it, rounding included), clamped so that 2^s and 2^-s are normal FP32
// numbers. amax_bits: the float bits of the block's largest |value| (integer order = float order for non-negative
// floats, and a NaN's bits exceed every finite one's, as in the reference's amax).
__device__ __forceinline__ int exponent_for(uint32_t amax_bits) {
  const int biased = static_cast<int>((amax_bits >> 23) & 0xffu);
  return min(max(biased - 127 - 14, -126), 113);
}

__device__ __forceinline__ float pow2(int e) { return __uint_as_float(static_cast<uint32_t>(127 + e) << 23); }

// Columns col .. col + 3 (col % 4 == 0) of row `row` as FP32 (exact: an FP16 value times a normal power of two).
// __ldcg (both loads): another CTA may have written them (the fused combine) after this SM's L1 saw the line.
template <int H>
__device__ __forceinline__ float4 load4(const __half* values, const int8_t* exponents, int64_t row, int col) {
  const uint2 bits = __ldcg(reinterpret_cast<const uint2*>(values + row * H + col));
  const float scale = pow2(__ldcg(exponents + row * (H / kBlock) + col / kBlock));
  const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&bits.x));
  const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&bits.y));
  return {lo.x * scale, lo.y * scale, hi.x * scale, hi.y * scale};
}

// The RouterWeight epilogue's stores for one warp of the wgmma accumulator: accum(v0 + 2*v1 + 4*v2) is weight row
// warp_row0 + g + 8*v1 (g = lane / 4) and token 2*q + v0 + 8*v2 (q = lane % 4) of the token tile at row0; the row is
// accum * token_scale[n] * token_weight[n]. Every lane must call it: the block amax and the FP16 pairs are exchanged
// by shuffles among the 8 lanes of one token (lane bits 2-4), and each lane stores one FP16 pair per token.
// Two passes: every token's shuffles and conversions first, then the stores. Interleaved with the stores, each
// token's chain of shuffles waited for the previous token's store (the compiler cannot move the shared-memory loads
// of token_scale above a global store it cannot prove apart): the down GEMM was ~25% slower on an H100.
template <int TN, int N, class Accum>
__device__ __forceinline__ void store_warp_rows(Accum accum, const float* token_scale, const float* token_weight,
                                                __half* values, int8_t* exponents, int warp_row0, int64_t row0,
                                                int rows_valid, int lane) {
  constexpr int kTokens = TN / 4;  // this lane's tokens: (v2, v0)
  const int g = lane / 4, q = lane % 4;
  uint32_t pair[kTokens];                // the FP16 pair this lane stores per token
  uint32_t exponent[(kTokens + 3) / 4];  // the block's s per token, four int8 per word
#pragma unroll
  for (int i = 0; i < (kTokens + 3) / 4; ++i) exponent[i] = 0;
#pragma unroll
  for (int i = 0; i < kTokens; ++i) {
    const int v2 = i / 2, v0 = i % 2, n = 2 * q + v0 + 8 * v2;
    const float y0 = accum(v0 + 4 * v2) * token_scale[n] * token_weight[n];      // row warp_row0 + g
    const float y1 = accum(v0 + 2 + 4 * v2) * token_scale[n] * token_weight[n];  // row warp_row0 + g + 8
    uint32_t amax = max(__float_as_uint(fabsf(y0)), __float_as_uint(fabsf(y1)));
#pragma unroll
    for (int d = 4; d < 32; d <<= 1) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, d));
    const int s = exponent_for(amax);
    const float down = pow2(-s);
    const float h0 = y0 * down, h1 = y1 * down;
    // even g stores rows g, g + 1 (its h0, the odd neighbour's h0); odd g rows g + 7, g + 8 (the even one's h1, its h1)
    const float take = __shfl_xor_sync(0xffffffffu, (g & 1) ? h0 : h1, 4);
    const __half2 h = (g & 1) ? __floats2half2_rn(take, h1) : __floats2half2_rn(h0, take);
    pair[i] = *reinterpret_cast<const uint32_t*>(&h);
    exponent[i / 4] |= (static_cast<uint32_t>(s) & 0xffu) << (8 * (i % 4));
  }
  // token n = 2q + (i % 2 + 8 (i / 2)): one base address per lane, and each token's offset a constant
  const int64_t row_q = row0 + 2 * q;
  uint32_t* pair_out = reinterpret_cast<uint32_t*>(values + row_q * N + warp_row0 + ((g & 1) ? g + 7 : g));
  int8_t* exponent_out = exponents + row_q * (N / kBlock) + warp_row0 / kBlock;
#pragma unroll
  for (int i = 0; i < kTokens; ++i) {
    const int dn = i % 2 + 8 * (i / 2);
    if (2 * q + dn >= rows_valid) continue;
    pair_out[dn * (N / 2)] = pair[i];
    if (g == 0) exponent_out[dn * (N / kBlock)] = static_cast<int8_t>(exponent[i / 4] >> (8 * (i % 4)));
  }
}

}  // namespace trace_kernels::moe::slot_rows
