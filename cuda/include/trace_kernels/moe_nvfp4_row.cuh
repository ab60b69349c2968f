// NVFP4 row quantization of the fused SwiGLU epilogues (moe_gemm.cuh, moe_gemm_ws.cuh): the last CTA
// of a token tile quantizes its complete rows of h, bit-exact with trace_kernels.nvfp4.quantize
// (scale="row"), and writes the MoE GEMM's extra outputs: the BF16 "value(code) * block scale"
// operand and the compact TRACE guidance bits. Its SM's tensor cores wait meanwhile, so the blocks
// take the quantize kernel's branch-free path (quantize_epilogue.cuh: packed BF16 thresholds, no
// division per element) for rows with row_scale_fast(s), and the checked path (block_step +
// quantize_block16) otherwise; both are bit for bit the reference.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include "trace_kernels/nvfp4.cuh"
#include "trace_kernels/quantize_epilogue.cuh"
#include "trace_kernels/status.cuh"

namespace trace_kernels::moe {

// Block blk of a row with row scale s: its codes, E4M3 scale, BF16 operand and guidance bits.
template <int D>
__device__ __forceinline__ void round_block_nvfp4(int blk, const Vec8<__nv_bfloat16>& lo,
                                                  const Vec8<__nv_bfloat16>& hi, int64_t row, float s, bool fast,
                                                  const nvfp4::Divisor& six_s,
                                                  uint8_t* codes, uint8_t* block_scales, __nv_bfloat16* dequant,
                                                  uint8_t* mantissa_bits) {
  uint4 dq_lo, dq_hi;
  const float block_amax = block16_abs_max<__nv_bfloat16>(lo, hi);
  const nvfp4::BlockStep step =
      fast ? block_step_fast(block_amax, s, six_s) : nvfp4::block_step(block_amax, s, nvfp4::kFp4Max * s);
  const uint2 q = fast ? quantize_block16_fast<__nv_bfloat16, true>(lo, hi, step, dq_lo, dq_hi)
                       : quantize_block16<__nv_bfloat16>(lo, hi, step, true, dq_lo, dq_hi);
  reinterpret_cast<uint2*>(codes + row * (D / 2))[blk] = q;
  block_scales[row * (D / 16) + blk] = step.scale_bits;
  uint4* dq = reinterpret_cast<uint4*>(dequant + row * D + blk * 16);
  dq[0] = dq_lo;
  dq[1] = dq_hi;
  reinterpret_cast<uint16_t*>(mantissa_bits + row * (D / 8))[blk] =
      static_cast<uint16_t>(mantissa_bits_of(q.x) | (mantissa_bits_of(q.y) << 8));
}

// One row per LANES lanes (a warp or a half warp). HOLD: the lane keeps its blocks in registers
// between the row amax and the rounding (one L2 round trip per row: wide tiles, whose CTA quantizes
// up to 256 rows and has the registers); else it reads them again from L2 (the 64-register budget
// of the decode tiles, where a CTA quantizes at most a few rows).
template <int D, int LANES, bool HOLD>
__device__ __forceinline__ void quantize_row_nvfp4(const __nv_bfloat16* h, int64_t row, bool valid, int lane,
                                                   uint8_t* codes, uint8_t* block_scales, float* row_scale,
                                                   __nv_bfloat16* dequant, uint8_t* mantissa_bits,
                                                   uint32_t* status) {
  static_assert(D % 16 == 0 && (LANES == 16 || LANES == 32), "D % 16 == 0, LANES in {16, 32}");
  using V = Vec8<__nv_bfloat16>;
  constexpr int kBlocks = D / 16;
  constexpr int kPerLane = (kBlocks + LANES - 1) / LANES;
  constexpr int kHeld = HOLD ? kPerLane : 1;
  // h was written by other CTAs of this launch: L2 loads (ld.cg), never the non-coherent path
  auto load_block = [&](int blk, V& lo, V& hi) {
    const uint4* src = reinterpret_cast<const uint4*>(h + blk * 16);
    lo.raw = __ldcg(src);
    hi.raw = __ldcg(src + 1);
  };
  V v[kHeld][2];
  float amax = 0.0f;  // pass 1: the row amax, all of the lane's loads in flight at once
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int blk = lane + LANES * i;
    if (valid && blk < kBlocks) {
      if constexpr (HOLD) {
        load_block(blk, v[i][0], v[i][1]);
        amax = nvfp4::fmax_nan(amax, block16_abs_max<__nv_bfloat16>(v[i][0], v[i][1]));
      } else {
        V lo, hi;
        load_block(blk, lo, hi);
        amax = nvfp4::fmax_nan(amax, block16_abs_max<__nv_bfloat16>(lo, hi));
      }
    }
  }
#pragma unroll
  for (int d = LANES / 2; d > 0; d >>= 1) amax = nvfp4::fmax_nan(amax, __shfl_xor_sync(0xffffffffu, amax, d));
  if (!valid) return;
  if (!nvfp4::is_finite(amax)) {  // SwiGLU overflowed: report, leave this row's outputs unwritten
    for (int blk = lane; blk < kBlocks; blk += LANES) {
      V w[2];
      load_block(blk, w[0], w[1]);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        float f[8];
        w[half].to_float(f);
        report_nonfinite(status, kStatusMoeGateUp, static_cast<uint64_t>(row), blk * 16 + half * 8, f);
      }
    }
    return;
  }
  const float s = __fdiv_rn(amax, nvfp4::kGlobalDivisor);
  if (lane == 0) row_scale[row] = s;
  const bool fast = row_scale_fast(s);
  const nvfp4::Divisor six_s = nvfp4::make_divisor(nvfp4::kFp4Max * s);
  if constexpr (HOLD) {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (lane + LANES * i < kBlocks)
        round_block_nvfp4<D>(lane + LANES * i, v[i][0], v[i][1], row, s, fast, six_s, codes, block_scales, dequant,
                             mantissa_bits);
  } else {
#pragma unroll 1
    for (int blk = lane; blk < kBlocks; blk += LANES) {  // pass 2: one block at a time, from L2 again
      V lo, hi;
      load_block(blk, lo, hi);
      round_block_nvfp4<D>(blk, lo, hi, row, s, fast, six_s, codes, block_scales, dequant, mantissa_bits);
    }
  }
}

// Rows whose blocks are held in registers take a whole warp beyond 64 blocks (D > 1024), else a half warp: at most
// 4 held blocks (32 registers) per lane.
template <int D>
constexpr bool held_row_takes_a_warp() { return D / 16 > 64; }

// The complete rows row0 .. row0 + rows of h [M, D] by WARPS warps (this one: `warp`), a row per
// warp (decode tiles) or, with its blocks held in registers, per half warp up to D = 1024 and per warp
// beyond (WIDE: tiles of >= 64 rows).
template <int D, bool WIDE, int WARPS>
__device__ __forceinline__ void quantize_rows_nvfp4(const __nv_bfloat16* h, int row0, int rows, int warp, int lane,
                                                    uint8_t* codes, uint8_t* block_scales, float* row_scale,
                                                    __nv_bfloat16* dequant, uint8_t* mantissa_bits,
                                                    uint32_t* status) {
  constexpr int kLanes = WIDE && !held_row_takes_a_warp<D>() ? 16 : 32;
  if constexpr (kLanes == 32) {
    for (int n = warp; n < rows; n += WARPS)
      quantize_row_nvfp4<D, 32, WIDE>(h + static_cast<size_t>(row0 + n) * D, row0 + n, true, lane, codes,
                                      block_scales, row_scale, dequant, mantissa_bits, status);
  } else {
    for (int n0 = 2 * warp; n0 < rows; n0 += 2 * WARPS) {  // warp-uniform; a half warp past the end shuffles
      const int n = n0 + lane / 16;
      quantize_row_nvfp4<D, 16, WIDE>(h + static_cast<size_t>(row0 + n) * D, row0 + n, n < rows, lane % 16, codes,
                                      block_scales, row_scale, dequant, mantissa_bits, status);
    }
  }
}

// ROW_AMAX tiles (TileConfig.row_amax): every CTA of the token tile folds the max |h| of its part of each row into
// the row's amax, so the last CTA needs no row reduction.

// A row's amax, shared by the CTAs that each write part of the row: every CTA folds in the max |h| of its part as
// an unsigned max of float bits. That is the float max for values >= 0, with NaN above inf above every finite value,
// so a non-finite part makes the row's amax non-finite as nvfp4::fmax_nan does; a max is exact and order-independent.
__device__ __forceinline__ uint32_t abs_bits(__nv_bfloat16 h) {
  return (static_cast<uint32_t>(__bfloat16_as_ushort(h)) << 16) & 0x7fff0000u;
}

// The epilogue's fold for one token column of a wgmma accumulator: the warp's 8 lanes of that column (lane % 4 the
// same, g = lane / 4 its 8 rows) reduce their |h| bits, then its g = 0 lane adds them to row_amax[m] with one RED.
// Every lane of the warp calls it (bits 0 and valid false for a column past the tile's rows).
__device__ __forceinline__ void fold_row_amax(uint32_t* row_amax, int64_t m, uint32_t bits, bool valid, int lane) {
#pragma unroll
  for (int d = 4; d < 32; d <<= 1) bits = max(bits, __shfl_xor_sync(0xffffffffu, bits, d));
  if (valid && lane < 4) atomicMax(row_amax + m, bits);
}

// Blocks blk0 .. blk0 + BLOCKS - 1 of rows row0 .. row0 + rows of h [M, D], one (row, block of 16) per thread in turn
// (THREADS threads, this one t), given each row's amax as float bits (amax_bits(row), row an int64: every part of the
// row folded in, fold_row_amax). Without a row reduction here, every (row, block) is independent: one round trip
// for the block and its row's amax together. BATCH blocks per thread go out at once (a wide tile's last CTA has 24
// per thread at 30B's TN=128; a decode tile's one or two, where BATCH = 1 keeps the registers of a 64-register
// kernel). The block holding column 0 writes its row's scale.
template <int D, int BLOCKS, int THREADS, int BATCH, class AmaxBits>
__device__ __forceinline__ void quantize_row_blocks_nvfp4(const __nv_bfloat16* h, int row0, int rows, int blk0, int t,
                                                          AmaxBits amax_bits, uint8_t* codes, uint8_t* block_scales,
                                                          float* row_scale, __nv_bfloat16* dequant,
                                                          uint8_t* mantissa_bits, uint32_t* status) {
  static_assert(D % 16 == 0 && BLOCKS >= 1 && BLOCKS <= D / 16 && BATCH >= 1, "D % 16 == 0, BLOCKS of D, BATCH >= 1");
  using V = Vec8<__nv_bfloat16>;
  const int total = rows * BLOCKS;
#pragma unroll 1
  for (int i0 = t; i0 < total; i0 += BATCH * THREADS) {
    V v[BATCH][2];
    uint32_t bits[BATCH];
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {  // h may come from other CTAs of this launch: L2 loads (ld.cg)
      const int i = i0 + b * THREADS;
      if (i < total) {
        const int64_t row = row0 + i / BLOCKS;
        const uint4* src = reinterpret_cast<const uint4*>(h + row * D + (blk0 + i % BLOCKS) * 16);
        v[b][0].raw = __ldcg(src);
        v[b][1].raw = __ldcg(src + 1);
        bits[b] = amax_bits(row);
      }
    }
#pragma unroll
    for (int b = 0; b < BATCH; ++b) {
      const int i = i0 + b * THREADS;
      if (i >= total) break;
      const int64_t row = row0 + i / BLOCKS;
      const int blk = blk0 + i % BLOCKS;
      const float amax = __uint_as_float(bits[b]);
      if (!nvfp4::is_finite(amax)) {  // SwiGLU overflowed: report, leave this row's outputs unwritten
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float f[8];
          v[b][half].to_float(f);
          report_nonfinite(status, kStatusMoeGateUp, static_cast<uint64_t>(row), blk * 16 + half * 8, f);
        }
      } else {
        const float s = __fdiv_rn(amax, nvfp4::kGlobalDivisor);
        if (blk == 0) row_scale[row] = s;
        round_block_nvfp4<D>(blk, v[b][0], v[b][1], row, s, row_scale_fast(s), nvfp4::make_divisor(nvfp4::kFp4Max * s),
                             codes, block_scales, dequant, mantissa_bits);
      }
    }
  }
}

// The complete rows row0 .. row0 + rows of h [M, D] (a last CTA's), their amaxes in row_amax [M] (fold_row_amax of
// every CTA that wrote them; h and row_amax come from other CTAs of this launch). The caller clears row_amax[row0 ..]
// after a barrier (clear_row_amax).
template <int D, int THREADS, int BATCH = 1>
__device__ __forceinline__ void quantize_rows_nvfp4_from_amax(const __nv_bfloat16* h, int row0, int rows, int t,
                                                              const uint32_t* row_amax, uint8_t* codes,
                                                              uint8_t* block_scales, float* row_scale,
                                                              __nv_bfloat16* dequant, uint8_t* mantissa_bits,
                                                              uint32_t* status) {
  quantize_row_blocks_nvfp4<D, D / 16, THREADS, BATCH>(
      h, row0, rows, 0, t, [&](int64_t row) { return __ldcg(row_amax + row); }, codes, block_scales, row_scale,
      dequant, mantissa_bits, status);
}

// row_amax of the rows a last CTA quantized back to zero for the next launch, once a barrier ordered every thread's
// reads of them (quantize_rows_nvfp4_from_amax) before.
template <int THREADS>
__device__ __forceinline__ void clear_row_amax(uint32_t* row_amax, int row0, int rows, int t) {
  for (int r = t; r < rows; r += THREADS) row_amax[row0 + r] = 0;
}

}  // namespace trace_kernels::moe
