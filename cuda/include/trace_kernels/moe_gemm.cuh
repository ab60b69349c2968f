// NVFP4-weight MoE grouped GEMM for Hopper (sm_90a): swap-AB wgmma with in-register dequantization.
//
// Semantics (python/trace_kernels/moe_gemm_ref.py is the reference; docs/moe_gemm.md):
//   y[m, n] = (sum_k a[src(m), k] * value(q_w[e, n, k]) * b_w[e, n, k/16]) * (s_w[e] * s_a[m])
// for the sorted routed rows m of expert e, FP32 accumulation in a fixed k order (no split-K), so a
// row's result never depends on the other rows or on the token-tile width.
//
// Structure of one CTA (NWG consumer warpgroups, every thread also issues cp.async loads):
//   * one work item = (token tile of TN sorted rows of one expert, 64*NWG weight rows);
//     blockIdx.x = weight tile, blockIdx.y = global token-tile index (scanned from offsets).
//   * weights are the wgmma M side: each warpgroup reads its 64 rows' FP4 codes + block scales
//     (fragment-ordered and encoded, moe_layout.py) from shared memory, dequantizes exactly to BF16
//     in registers (moe_dequant.cuh: value * scale * 2^-7, folded back into the row scale; one
//     16-wide scale block = one k16 step) and issues
//     wgmma.m64nTNk16 with A from registers and B = the gathered activation rows (K-major,
//     128B-swizzled) in shared memory; tokens are the wgmma N dimension.
//   * a STAGES-deep cp.async ring; a stage holds CPS K chunks of 64 (one wait + CTA barrier per stage).
//   * or (WDIRECT > 0) the token tile's activations for the whole K resident in shared memory (one wait +
//     CTA barrier per CTA) and each thread's weight bytes loaded straight into registers WDIRECT chunks
//     ahead: no shared-memory round trip and no CTA barrier in the main loop.
// Epilogues: Plain (bf16 [M, N]), SwigluQuant (gate/up rows interleaved by 8: a thread holds the
// gate and up of the same intermediate index; bf16 SwiGLU h, then the last CTA of a token tile
// quantizes whole rows of h to NVFP4 + guidance), Swiglu (SwigluQuant's h only: the caller quantizes
// h with the quantize kernel afterwards; no tile counter, fence or last-CTA work), RouterWeight ([M, N] times the
// router weight, stored as scaled fp16 per-slot rows (moe_slot_rows.cuh); moe_combine_kernel sums the top-k slots in
// slot order, or with COMBINE_TOPK the last of a token's CTAs in this kernel's epilogue).
#pragma once

#include <cstdint>
#include <utility>

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cute/tensor.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/arch/mma_sm90_gmma_ext.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "trace_kernels/cluster.cuh"
#include "trace_kernels/cta_timeline.cuh"
#include "trace_kernels/moe_dequant.cuh"
#include "trace_kernels/moe_nvfp4_row.cuh"
#include "trace_kernels/moe_slot_rows.cuh"
#include "trace_kernels/pdl.cuh"
#include "trace_kernels/tile_arrival.cuh"

namespace trace_kernels::moe {

enum class Epilogue : int { Plain = 0, SwigluQuant = 1, RouterWeight = 2, Swiglu = 3 };

// Kernel parameters. Only 8-byte fields so that the host can pack it as an array of uint64
// (python/trace_kernels/moe_gemm.py, _Params: keep the two in the same order).
struct MoEGemmParams {
  const __nv_bfloat16* a;      // [rows_a, K] activations (gathered through row_index)
  const int32_t* row_index;    // [M] source row of each sorted row, or nullptr (identity)
  const float* row_scale;      // [rows_a] activation row scale s_a (gathered like a), or nullptr (W4A16: 1)
  const uint8_t* w_codes;      // [E, N/64, K/64, 2048] fragment-ordered, encoded FP4 codes
  const uint8_t* w_scales;     // [E, N/64, K/64, 256] fragment-ordered, encoded block scales
  const float* w_scale;        // [E] per-expert tensor scale
  const int32_t* offsets;      // [E+1] sorted rows of expert e: offsets[e]..offsets[e+1]
  int64_t num_rows;            // M
  __nv_bfloat16* out;          // Plain: [M, N] bf16; SwigluQuant, Swiglu: h [M, N/2] bf16
  __half* slot_values;         // RouterWeight: [M, N] fp16 per-slot rows (moe_slot_rows.cuh)
  int8_t* slot_exponents;      // RouterWeight: [M, N/2] their power-of-two exponents, one per pair of columns
  const float* row_weight;     // RouterWeight: [M] router weight of each sorted row
  uint8_t* q_codes;            // SwigluQuant: [M, N/4] packed codes of h
  uint8_t* q_block_scales;     // SwigluQuant: [M, N/32] e4m3
  float* q_scale;              // SwigluQuant: [M] row scale
  __nv_bfloat16* q_dequant;    // SwigluQuant: [M, N/2] value(code) * block scale
  uint8_t* q_mantissa_bits;    // SwigluQuant: [M, N/16] guidance bits
  int32_t* tile_counters;      // SwigluQuant: [gridDim.y] zero on entry, left zero on exit
  uint32_t* status;            // SwigluQuant: status word (status.cuh) for a non-finite SwiGLU row
  // RouterWeight with the combine in the epilogue (v1, COMBINE_TOPK > 0; else unused)
  const int32_t* row_token;    // [M] token of each sorted row
  const int32_t* slot_rows;    // [T, TOPK] sorted row of each token's slot
  __nv_bfloat16* combine_out;  // [T, N] bf16: the ordered top-k sum
  int32_t* combine_counters;   // [T, N / (64 NWG)] zero on entry, left zero on exit
  uint32_t* row_amax;          // SwigluQuant with ROW_AMAX: [M] row amax of h (fold_row_amax); zero on entry and exit
};

namespace detail {

constexpr int kChunkK = 64;          // K elements per pipeline stage (4 k16 steps, one SW128 row)
constexpr int kCodeRecord = 2048;    // bytes of codes per (64-row tile, K chunk)
constexpr int kScaleRecord = 256;    // bytes of block scales per (64-row tile, K chunk)

__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, bool valid) {
  uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  int src_bytes = valid ? 16 : 0;  // 0: zero-fill (rows past the expert's end)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem_src), "r"(src_bytes));
}
// cp_async_16 under a PTX predicate (no C++ branch around it; ptxas still decides between predication
// and a branch, and the tables' kernels were measured with this form).
__device__ __forceinline__ void cp_async_16_if(void* smem_dst, const void* gmem_src, bool pred) {
  uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p cp.async.cg.shared.global [%0], [%1], 16;\n}\n"
               ::"r"(dst), "l"(gmem_src), "r"(static_cast<int>(pred)));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
// Weight bytes read once (WDIRECT): straight into registers, not kept in L1. ORDERED (the prologue's loads, ahead of
// griddepcontrol.wait): volatile and not .nc, so that neither the compiler nor ptxas sinks them past that wait and the
// weights stream while the previous kernel finishes (ptxas moved the .nc loads past it and past the CTA barrier once
// the token rows' loads were split, fifty-fifth session); the main loop's refills stay .nc and free to move.
template <bool ORDERED = false>
__device__ __forceinline__ uint4 ldg_stream_16(const void* src) {
  uint4 v;
  if constexpr (ORDERED) {
    asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(src));
  } else {
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(src));
  }
  return v;
}
template <bool ORDERED = false>
__device__ __forceinline__ uint2 ldg_stream_8(const void* src) {
  uint2 v;
  if constexpr (ORDERED) {
    asm volatile("ld.global.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(src));
  } else {
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(src));
  }
  return v;
}
// L2_PREFETCH: `bytes` (a multiple of 16) from `src` (16-byte aligned) into L2 by the TMA unit, one instruction and no
// destination or completion to wait for: a CTA's later weight chunks requested in bulk ahead of the PDL wait.
__device__ __forceinline__ void prefetch_l2_bulk(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
}
// cp.async writes through the generic proxy; wgmma reads shared memory through the async proxy.
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// SwiGLU's h only has to be this kernel's own deterministic BF16 value (its quantization is then
// exact): fast exp and division keep the IEEE-division slow path (a call) out of the epilogue.
__device__ __forceinline__ float silu(float g) { return __fdividef(g, 1.0f + __expf(-g)); }

// The SwiGLU epilogue of ROW_AMAX and CLUSTER_Q tiles for one thread's weight-row pair at intermediate `inter` of
// h [M, I]: stores h for each of its token columns (gate acc(v0 + 4 v2), up acc(v0 + 2 + 4 v2), v1's and ws's
// accumulator order) and folds each token row's |h| into row_amax[amax_row0 + n] (global [M] with amax_row0 = row0,
// or the CTA's shared [TN] with 0; fold_row_amax shuffles across the warp: every lane runs the whole loop).
template <int TN, int I, class Acc>
__device__ __forceinline__ void swiglu_store_fold_amax(Acc acc, const float* token_scale, __nv_bfloat16* h,
                                                       uint32_t* row_amax, int amax_row0, int inter, int row0,
                                                       int rows_valid, int lane, float scale_fold) {
#pragma unroll
  for (int v2 = 0; v2 < TN / 8; ++v2) {
#pragma unroll
    for (int v0 = 0; v0 < 2; ++v0) {
      const int n = 2 * (lane % 4) + v0 + 8 * v2;
      const bool valid = n < rows_valid;
      uint32_t bits = 0;
      if (valid) {
        const float scale = token_scale[n] * scale_fold;
        const __nv_bfloat16 hn = __float2bfloat16_rn(silu(acc(v0 + 4 * v2) * scale) * (acc(v0 + 2 + 4 * v2) * scale));
        h[static_cast<size_t>(row0 + n) * I + inter] = hn;
        bits = abs_bits(hn);
      }
      fold_row_amax(row_amax, amax_row0 + n, bits, valid, lane);
    }
  }
}

// One warp's epilogue stores (v1's and ws's, every epilogue but SwigluQuant's last-CTA quantization) of its 16 weight
// rows warp_row0 .. warp_row0 + 15 x TN token columns: accum(v0 + 2 v1 + 4 v2) is weight row warp_row0 + g + 8 v1,
// token 2q + v0 + 8 v2 (g = lane / 4, q = lane % 4). SwiGLU weight rows are interleaved by 8: rows 16b..16b+7 gate,
// 16b+8..16b+15 up of intermediate 8b..8b+7, so a thread holds the gate and up of intermediate warp_row0 / 2 + g.
// FOLD_AMAX (SwigluQuant of ROW_AMAX and CLUSTER_Q tiles): h stored and each row's |h| folded into
// row_amax[amax_row0 + n] (swiglu_store_fold_amax). Token n's output scale s_w[e] * 2^7 * s_a is token_scale[n] *
// scale_fold: v1 keeps the product in token_scale (scale_fold 1), ws keeps s_a and passes s_w (store_token_row).
template <int N, int TN, Epilogue EPI, bool FOLD_AMAX, class Accum>
__device__ __forceinline__ void store_warp_tile(const MoEGemmParams& p, Accum accum, const float* token_scale,
                                                const float* token_weight, int warp_row0, int row0, int rows_valid,
                                                int lane, uint32_t* row_amax, int amax_row0, float scale_fold) {
  const int g = lane / 4, q = lane % 4;
  if constexpr (EPI == Epilogue::RouterWeight) {  // the per-slot rows, as the combine reads them
    slot_rows::store_warp_rows<TN, N>(accum, token_scale, token_weight, p.slot_values, p.slot_exponents, warp_row0,
                                      row0, rows_valid, lane, scale_fold);
  } else if constexpr (EPI == Epilogue::SwigluQuant && FOLD_AMAX) {  // as Swiglu, and each token row's amax folded
    swiglu_store_fold_amax<TN, N / 2>(accum, token_scale, p.out, row_amax, amax_row0, warp_row0 / 2 + g, row0,
                                      rows_valid, lane, scale_fold);
  } else {
    const int wrow = warp_row0 + g, inter = warp_row0 / 2 + g;  // (hoisted as before: the same SASS)
#pragma unroll
    for (int v2 = 0; v2 < TN / 8; ++v2) {
#pragma unroll
      for (int v0 = 0; v0 < 2; ++v0) {
        const int n = 2 * q + v0 + 8 * v2;
        if (n >= rows_valid) continue;
        const int m = row0 + n;
        const float scale = token_scale[n] * scale_fold;
        const float y0 = accum(v0 + 4 * v2) * scale;      // row warp_row0 + g
        const float y1 = accum(v0 + 2 + 4 * v2) * scale;  // row warp_row0 + g + 8
        if constexpr (EPI == Epilogue::Plain) {
          p.out[static_cast<size_t>(m) * N + wrow] = __float2bfloat16_rn(y0);
          p.out[static_cast<size_t>(m) * N + wrow + 8] = __float2bfloat16_rn(y1);
        } else {  // Swiglu, SwigluQuant without ROW_AMAX
          p.out[static_cast<size_t>(m) * (N / 2) + inter] = __float2bfloat16_rn(silu(y0) * y1);
        }
      }
    }
  }
}

// The single wgmma instruction m64nNNk16 f32.bf16.bf16 with A from registers (CuTe's rs_op_selector would tile
// N = 24, 40, ... with narrower instructions).
template <int NN>
struct RsColumnsOp;
#define TRACE_KERNELS_RS_COLUMNS_OP(NN)                                                                     \
  template <>                                                                                             \
  struct RsColumnsOp<NN> {                                                                                \
    using type = cute::SM90::GMMA::MMA_64x##NN##x16_F32BF16BF16_RS<cute::SM90::GMMA::Major::K,             \
                                                                    cute::SM90::GMMA::Major::K>;            \
  };
TRACE_KERNELS_RS_COLUMNS_OP(8) TRACE_KERNELS_RS_COLUMNS_OP(16) TRACE_KERNELS_RS_COLUMNS_OP(24)
TRACE_KERNELS_RS_COLUMNS_OP(32) TRACE_KERNELS_RS_COLUMNS_OP(40) TRACE_KERNELS_RS_COLUMNS_OP(48)
TRACE_KERNELS_RS_COLUMNS_OP(56) TRACE_KERNELS_RS_COLUMNS_OP(64) TRACE_KERNELS_RS_COLUMNS_OP(72)
TRACE_KERNELS_RS_COLUMNS_OP(80) TRACE_KERNELS_RS_COLUMNS_OP(88) TRACE_KERNELS_RS_COLUMNS_OP(96)
TRACE_KERNELS_RS_COLUMNS_OP(104) TRACE_KERNELS_RS_COLUMNS_OP(112) TRACE_KERNELS_RS_COLUMNS_OP(120)
TRACE_KERNELS_RS_COLUMNS_OP(128) TRACE_KERNELS_RS_COLUMNS_OP(136) TRACE_KERNELS_RS_COLUMNS_OP(144)
TRACE_KERNELS_RS_COLUMNS_OP(152) TRACE_KERNELS_RS_COLUMNS_OP(160) TRACE_KERNELS_RS_COLUMNS_OP(168)
TRACE_KERNELS_RS_COLUMNS_OP(176) TRACE_KERNELS_RS_COLUMNS_OP(184) TRACE_KERNELS_RS_COLUMNS_OP(192)
TRACE_KERNELS_RS_COLUMNS_OP(200) TRACE_KERNELS_RS_COLUMNS_OP(208) TRACE_KERNELS_RS_COLUMNS_OP(216)
TRACE_KERNELS_RS_COLUMNS_OP(224) TRACE_KERNELS_RS_COLUMNS_OP(232) TRACE_KERNELS_RS_COLUMNS_OP(240)
TRACE_KERNELS_RS_COLUMNS_OP(248)
#undef TRACE_KERNELS_RS_COLUMNS_OP

// wgmma m64nNNk16 (A: 4 bf16x2 registers, B: a K-major smem descriptor) into the first NN / 2 registers of a
// wider tile's accumulator: its columns 0..NN-1, the same registers the TN-wide instruction gives them.
template <int NN, class Accum, size_t... I>
__device__ __forceinline__ void wgmma_rs_columns(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint64_t desc_b,
                                                 Accum& accum, std::index_sequence<I...>) {
  static_assert(sizeof...(I) == NN / 2, "one accumulator register per two columns");
  RsColumnsOp<NN>::type::fma(a0, a1, a2, a3, desc_b, accum(I)..., cute::SM90::GMMA::ScaleOut::One);
}

// f(Int<NN>{}) for the smallest NN in {STEP, 2 STEP, ..., TN} with n <= NN (a chain of uniform branches).
template <int TN, int STEP, class F>
__device__ __forceinline__ void with_columns(int n, F&& f) {
  if constexpr (TN <= STEP) {
    f(cute::Int<TN>{});
  } else {
    if (n <= TN - STEP) {
      with_columns<TN - STEP, STEP>(n, f);
    } else {
      f(cute::Int<TN>{});
    }
  }
}

}  // namespace detail

// Shared-memory plan of one CTA; the generator passes its own byte count and the kernel checks it.
// WEIGHTS = false: the ring holds activations only (weights go straight to registers, WDIRECT).
// AMAX_WORDS: uint32 words of the CLUSTER_Q epilogue's row amaxes (2 TN; else 0).
template <int TN, int NWG, int STAGES, bool WEIGHTS = true, int AMAX_WORDS = 0>
struct MoESmem {
  static constexpr int kBStage = TN * detail::kChunkK * 2;          // bf16 activation tile
  static constexpr int kCodesStage = WEIGHTS ? NWG * detail::kCodeRecord : 0;
  static constexpr int kScalesStage = WEIGHTS ? NWG * detail::kScaleRecord : 0;
  static constexpr int kB = 0;                                       // 1024-aligned (SW128)
  static constexpr int kCodes = kB + STAGES * kBStage;
  static constexpr int kScales = kCodes + STAGES * kCodesStage;
  static constexpr int kSrcRows = kScales + STAGES * kScalesStage;   // int32 [TN]
  static constexpr int kTokenScale = kSrcRows + TN * 4;              // float [TN]: s_w[e] * 2^7 * s_a[src]
  static constexpr int kTokenWeight = kTokenScale + TN * 4;          // float [TN]: router weight (RouterWeight)
  static constexpr int kRowAmax = kTokenWeight + TN * 4;             // uint32 [AMAX_WORDS] (CLUSTER_Q)
  static constexpr int kTileStart = kRowAmax + AMAX_WORDS * 4;       // int32 [E+1] (sized by the caller)
  static constexpr int bytes(int num_experts) { return kTileStart + (num_experts + 1) * 4 + 16 + 1024; }
};

// The sum of v over lanes 0 .. lane of a warp (every lane calls it).
__device__ __forceinline__ int warp_inclusive_sum(int v, int lane) {
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, v, d);
    if (lane >= d) v += u;
  }
  return v;
}

// tile_start[e] = the first token tile of expert e (exclusive scan of ceil(rows_e / TN) over the E
// experts), tile_start[E] = the number of tiles. Called by warp 0 (tid < 32) only.
template <int E, int TN>
__device__ __forceinline__ void scan_expert_tiles(const int32_t* offsets, int32_t* tile_start, int tid) {
  constexpr int kPer = (E + 31) / 32;
  int local[kPer];
  int sum = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = tid * kPer + i;
    int tiles = 0;
    if (e < E) tiles = (offsets[e + 1] - offsets[e] + TN - 1) / TN;
    local[i] = sum;
    sum += tiles;
  }
  const int incl = warp_inclusive_sum(sum, tid);
  const int base = incl - sum;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = tid * kPer + i;
    if (e < E) tile_start[e] = base + local[i];
  }
  if (tid == 31) tile_start[E] = incl;
}

// v1's CTA start: the token tile y_tile's expert, first sorted row and valid rows into tile[0..2] and the number of
// token tiles into tile[3], by scan_expert_tiles' scan with the search in warp 0 too. One barrier after it, not two,
// and the offsets read once (a CTA's weight requests wait on this chain). tile[0..2] are left unwritten when y_tile
// is past the last tile. Called by warp 0 (lane = tid < 32) only.
template <int E, int TN>
__device__ __forceinline__ void find_token_tile(const int32_t* offsets, int y_tile, int32_t* tile, int lane) {
  constexpr int kPer = (E + 31) / 32;
  int first[kPer], rows[kPer], start[kPer];
  int sum = 0;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = lane * kPer + i;
    first[i] = 0;
    rows[i] = 0;
    if (e < E) {
      first[i] = offsets[e];
      rows[i] = offsets[e + 1] - first[i];
    }
    start[i] = sum;
    sum += (rows[i] + TN - 1) / TN;
  }
  const int incl = warp_inclusive_sum(sum, lane);
  const int base = incl - sum;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int tile0 = base + start[i];  // an empty expert has no tile, so at most one (lane, i) matches
    if (rows[i] > 0 && tile0 <= y_tile && y_tile < tile0 + (rows[i] + TN - 1) / TN) {
      const int row0 = first[i] + (y_tile - tile0) * TN;
      tile[0] = lane * kPer + i;
      tile[1] = row0;
      tile[2] = min(TN, first[i] + rows[i] - row0);
    }
  }
  if (lane == 31) tile[3] = incl;
}

// Row n of a token tile (its sorted rows row0 .. row0 + rows_valid - 1), as requested from global memory: the source
// row (-1 past the expert's end), its activation row scale s_a (1 without one) and router weight (RouterWeight; else
// 0). Nothing here reads the loaded values, so the loads of scale and weight stay in flight until store_token_row.
struct TokenRowLoads {
  int src;
  float row_scale, weight;
};
template <Epilogue EPI>
__device__ __forceinline__ TokenRowLoads request_token_row(const MoEGemmParams& p, int row0, int rows_valid, int n) {
  TokenRowLoads r{-1, 0.0f, 0.0f};
  if (n < rows_valid) {
    r.src = p.row_index ? p.row_index[row0 + n] : row0 + n;
    r.row_scale = p.row_scale ? p.row_scale[r.src] : 1.0f;
    if constexpr (EPI == Epilogue::RouterWeight) r.weight = p.row_weight[row0 + n];
  }
  return r;
}
// Rows n = first + i * stride (i < HELD) of a token tile, requested into held (request_token_row), their source rows
// stored in src_rows for the activation copies (rows n >= TN: none).
template <int TN, int HELD, Epilogue EPI>
__device__ __forceinline__ void request_token_rows(const MoEGemmParams& p, int row0, int rows_valid, int first,
                                                   int stride, int32_t* src_rows, TokenRowLoads (&held)[HELD]) {
#pragma unroll
  for (int i = 0; i < HELD; ++i) {
    const int n = first + i * stride;
    held[i] = request_token_row<EPI>(p, row0, rows_valid, n);
    if (n < TN) src_rows[n] = held[i].src;
  }
}
// Row n's activation row scale s_a (0 past the expert's end) and router weight into shared memory, as loaded; the
// output scale is s_a times s_w[e] * 2^7 (A holds the weights * 2^-7, exact). No arithmetic here, so that ptxas keeps
// these stores where they are written: a product s_w * s_a in their place went ahead of the activation copies issued
// before them and waited for the scale's load (fifty-eighth session, SASS).
__device__ __forceinline__ void store_token_row(const TokenRowLoads& r, int n, float* scale_out, float* weight_out) {
  scale_out[n] = r.row_scale;
  weight_out[n] = r.weight;
}

// The combine in the down GEMM's epilogue (v1, COMBINE_TOPK): after this CTA's per-slot rows are stored, each
// row counts one arrival of its token on this weight tile's columns; the CTA whose arrival completes a token's
// TOPK sums that token's TOPK rows of these columns in slot order, exactly as moe_combine_device does (the same
// bits whichever CTA it is), and leaves its counter zero. won: int32 [TN] of shared memory.
// Each arrival is one thread's acq_rel atomic after a barrier (tile_arrival.cuh): its release half publishes the
// whole CTA's rows, its acquire half, handed on by the next barrier, lets the CTA read the other arrivers' rows.
// (Until the sixty-first session every thread fenced with the sequentially consistent MEMBAR.SC.GPU before the
// barrier, and the winners again after it.)
template <int N, int BLOCK_ROWS, int TN, int TOPK, int THREADS>
__device__ __forceinline__ void combine_last_arrivals(const MoEGemmParams& p, int row0, int rows_valid, int wt, int tid,
                                                      int32_t* won) {
  constexpr int kTiles = N / BLOCK_ROWS;                  // weight tiles (counters) per token
  constexpr int kBlocks = BLOCK_ROWS / slot_rows::kBlock;  // 16-column blocks of one token's slice
  __syncthreads();  // every thread's per-slot rows, before the arrivals below
  for (int n = tid; n < TN; n += THREADS) {
    int token = -1;
    if (n < rows_valid) {
      const int t = p.row_token[row0 + n];
      if (arrive_acq_rel_gpu(&p.combine_counters[static_cast<size_t>(t) * kTiles + wt]) == TOPK - 1) token = t;
    }
    won[n] = token;
  }
  __syncthreads();
  bool any = false;
#pragma unroll
  for (int n = 0; n < TN; ++n) any |= won[n] >= 0;
  if (!any) return;
  // One quarter block per item (combine_quarter: every slot's loads at once), quarters of a block on adjacent threads
  for (int i = tid; i < TN * kBlocks * 4; i += THREADS) {
    const int n = i / (kBlocks * 4), c = (i / 4) % kBlocks, q = i % 4;
    const int t = won[n];
    if (t < 0) continue;
    int32_t rows[TOPK];  // the routing's, from before this launch: the read-only path
#pragma unroll
    for (int j = 0; j < TOPK; ++j) rows[j] = __ldg(p.slot_rows + static_cast<size_t>(t) * TOPK + j);
    slot_rows::combine_quarter<N, TOPK>(p.slot_values, p.slot_exponents, rows, wt * kBlocks + c, q,
                                        p.combine_out + static_cast<size_t>(t) * N);
    if (c == 0 && q == 0) p.combine_counters[static_cast<size_t>(t) * kTiles + wt] = 0;  // ready for the next launch
  }
}

// PROXY_FENCE: fence.proxy.async after each stage lands, ordering the cp.async (generic proxy) writes
// of the activation tile before wgmma's (async proxy) reads, as the PTX memory model asks. It
// compiles to MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S; whether that MEMBAR also waits for the ring's
// later, still-flying cp.asyncs (draining the prefetch every iteration) is being measured. CUTLASS's
// cp.async + GMMA mainloops issue no such fence. false is an experiment until tested on the GPU.
// OVERLAP: see the main loop. Slower than the plain loop at every table tile on the H200 (docs/moe_gemm.md,
// eleventh session of 2026-12-02), so only the A/B table auto_ov and extra tiles use it.
// WDIRECT > 0: weights straight into registers WDIRECT K chunks ahead, activations resident for the whole K
// (STAGES, CPS, PROXY_FENCE and OVERLAP then unused: one ring slot per K chunk, one fence per CTA).
// COMBINE_TOPK > 0 (RouterWeight only): the ordered top-k combine in the epilogue (combine_last_arrivals), no
// moe_combine launch after the GEMM.
// NSTEP > 0: the wgmmas are as wide as the CTA's routed rows rounded up to NSTEP (one main loop per width), not TN.
// STEP_PIPE (ring tiles of CPS >= 2): each k16 step's wgmma is its own commit group, and a chunk's step j is
// dequantized into the A registers once the previous chunk's step j has completed (wait_group 3), so a warpgroup
// dequantizes while its own wgmmas run; the wgmmas drain at each stage's end, before the barrier that lets the ring
// refill the stage. (Without it a warpgroup waits for its chunk's four wgmmas before dequantizing the next chunk: 24-30%
// of the prefill GEMMs' warp samples, thirty-seventh session.) No extra registers: the same 16 A registers.
// ROW_AMAX (SwigluQuant only): every CTA folds its part of each row's amax into p.row_amax (fold_row_amax), and the
// last CTA quantizes each (row, block of 16) on its own thread without a row reduction (quantize_rows_nvfp4_from_amax).
// CLUSTER_Q > 0 (SwigluQuant only; the kernel is compiled with __cluster_dims__(CLUSTER_Q, 1, 1), CLUSTER_Q = N / (64
// NWG): a token tile's CTAs are one cluster): every CTA folds its part of each row's amax into its own shared memory,
// reads the other CTAs' parts after a cluster barrier, and quantizes its own columns of h; no tile counter, no last
// CTA, no global round trip of the amax.
// L2_PREFETCH: before the PDL wait, one bulk L2 prefetch per warpgroup of its weight chunks past those the prologue
// requested (TileConfig.l2_prefetch).
template <int E, int N, int K, int TN, int NWG, int STAGES, Epilogue EPI, int SMEM_BYTES, bool PROXY_FENCE = true,
          bool OVERLAP = false, int CPS = 1, int WDIRECT = 0, int COMBINE_TOPK = 0, int NSTEP = 0,
          bool GATHER_PIECES = false, bool STEP_PIPE = false, bool ROW_AMAX = false, int CLUSTER_Q = 0,
          bool L2_PREFETCH = false>
__device__ __forceinline__ void moe_gemm_device(const MoEGemmParams& p) {
  using namespace cute;
  constexpr bool kDirect = WDIRECT > 0;
  constexpr int kSlots = kDirect ? K / detail::kChunkK : STAGES * CPS;  // chunk slots of the ring
  constexpr bool kCluster = CLUSTER_Q > 0;
  using Smem = MoESmem<TN, NWG, kSlots, !kDirect, (kCluster ? 2 * TN : 0)>;
  constexpr int kThreads = NWG * 128;
  constexpr int kBlockRows = 64 * NWG;     // weight rows per CTA
  constexpr int kRowTiles = N / 64;        // 64-row tiles per expert
  constexpr int kChunks = K / detail::kChunkK;
  static_assert(N % kBlockRows == 0 && K % detail::kChunkK == 0, "N % (64*NWG) and K % 64 must be 0");
  static_assert(TN % 8 == 0 && TN >= 8 && TN <= 256, "wgmma N is 8..256 in steps of 8");
  static_assert(kDirect || STAGES >= 2, "need at least a double buffer");
  static_assert(CPS >= 1 && kChunks % CPS == 0, "K % (64 CPS) == 0");
  static_assert(!OVERLAP || kSlots % 2 == 0, "OVERLAP alternates two A buffers by ring slot: STAGES * CPS even");
  static_assert(!kDirect || (!OVERLAP && STAGES == 1 && CPS == 1), "WDIRECT: no ring (STAGES = CPS = 1), no OVERLAP");
  static_assert(Smem::bytes(E) <= SMEM_BYTES, "generator's shared-memory size is too small");
  static_assert((EPI != Epilogue::SwigluQuant && EPI != Epilogue::Swiglu) || (N % 32 == 0), "SwiGLU needs 2I % 32 == 0");
  static_assert(COMBINE_TOPK == 0 || EPI == Epilogue::RouterWeight, "the combine belongs to the down GEMM's epilogue");
  static_assert(!STEP_PIPE || (!kDirect && !OVERLAP && CPS >= 2), "STEP_PIPE: the plain ring with stages of 2+ chunks");
  static_assert(CLUSTER_Q == 0 || (EPI == Epilogue::SwigluQuant && !ROW_AMAX && CLUSTER_Q == N / kBlockRows &&
                                   CLUSTER_Q <= 16),
                "CLUSTER_Q: the fused SwiGLU epilogue, one cluster of all N / (64 NWG) weight tiles (at most 16)");
  static_assert(NSTEP == 0 || (NSTEP % 8 == 0 && NSTEP < TN && TN % (NSTEP ? NSTEP : 1) == 0),
                "NSTEP: a multiple of 8 below TN that divides it");  // (NSTEP ? : 1: no "% zero" warning at NSTEP = 0)

  extern __shared__ uint8_t smem_raw[];
  // Round up to 1024 B (SW128 atoms) by offsetting smem_raw itself, so the compiler still knows every
  // derived pointer is shared memory (LDS, not generic LD); the shared window keeps low address bits.
  const uint32_t smem_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  uint8_t* smem = smem_raw + ((1024u - (smem_base & 1023u)) & 1023u);
  int32_t* src_rows = reinterpret_cast<int32_t*>(smem + Smem::kSrcRows);
  float* token_scale = reinterpret_cast<float*>(smem + Smem::kTokenScale);
  float* token_weight = reinterpret_cast<float*>(smem + Smem::kTokenWeight);
  // (4 of the E + 1 words MoESmem keeps at kTileStart, where v1 kept the whole scan before find_token_tile)
  static_assert(E >= 3, "token_tile's 4 words");
  int32_t* token_tile = reinterpret_cast<int32_t*>(smem + Smem::kTileStart);  // expert, row0, rows_valid, tiles
  int32_t* item = token_tile + E + 1;                                         // [1]: the last-CTA flag
  // CLUSTER_Q: this CTA's part of each row's amax (read by the cluster's other CTAs), then the whole row's
  uint32_t* part_amax = reinterpret_cast<uint32_t*>(smem + Smem::kRowAmax);   // [TN]
  uint32_t* row_amax = part_amax + TN;                                        // [TN]

  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int wt = blockIdx.x;         // weight tile
  const int y_tile = blockIdx.y;     // global token tile

  // ---- which (expert, token tile) is blockIdx.y: exclusive scan of ceil(rows_e / TN) ----
  CTA_STAMP(0);  // per-CTA timeline (cta_timeline.cuh, moe_timeline.py): empty unless TRACE_KERNELS_CTA_TIMELINE
  if (tid < 32) find_token_tile<E, TN>(p.offsets, y_tile, token_tile, tid);
  if constexpr (kCluster) {
    for (int n = tid; n < TN; n += kThreads) part_amax[n] = 0;  // (folded into in the epilogue, many barriers later)
  }
  __syncthreads();
  if (y_tile >= token_tile[3]) return;  // the grid is an upper bound (moe_routing.token_tile_bound)
  const int expert = token_tile[0];
  const int row0 = token_tile[1];
  const int rows_valid = token_tile[2];
  CTA_STAMP(1);
  CTA_NOTE(static_cast<unsigned long long>(expert) << 32 | static_cast<unsigned>(rows_valid));
  // NSTEP: the wgmmas' N is rows_valid rounded up to NSTEP, not TN (the columns past it would be discarded)
  const int n_mma = NSTEP ? min(TN, (rows_valid + NSTEP - 1) / NSTEP * NSTEP) : TN;

  // ---- wgmma: 64 x TN x 16, A (weights) from registers, B (tokens) K-major SW128 in smem ----
  using MmaOp = decltype(SM90::GMMA::rs_op_selector<bfloat16_t, bfloat16_t, float, Shape<_64, Int<TN>, _16>>());
  TiledMMA tiled_mma = make_tiled_mma(MmaOp{});
  auto thr_mma = tiled_mma.get_thread_slice(tid % 128);
  using SmemLayoutB = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<bfloat16_t>{},
                                             make_shape(Int<TN>{}, Int<detail::kChunkK>{}, Int<kSlots>{})));
  using SmemLayoutA = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<bfloat16_t>{},
                                             make_shape(_64{}, Int<detail::kChunkK>{})));
  bfloat16_t* smem_b = reinterpret_cast<bfloat16_t*>(smem + Smem::kB);
  Tensor sB = make_tensor(make_smem_ptr(smem_b), SmemLayoutB{});               // (TN, 64, slots)
  Tensor sA_shape = make_tensor(make_smem_ptr(smem_b), SmemLayoutA{});         // (64, 64): shape only
  Tensor tCsB = thr_mma.partition_B(sB);                                       // (MMA, 1, 4, slots)
  Tensor tCrB = thr_mma.make_fragment_B(tCsB);                                 // descriptors
  Tensor tCrA = thr_mma.partition_fragment_A(sA_shape);                        // (MMA, 1, 4) bf16 regs
  Tensor accum = partition_fragment_C(tiled_mma, Shape<_64, Int<TN>>{});       // ((2,2,TN/8), 1, 1)
  static_assert(size<2>(tCrA) == 4 && size(accum) == TN / 2, "unexpected wgmma fragment shapes");
  clear(accum);

  const size_t record = (static_cast<size_t>(expert) * kRowTiles + wt * NWG) * kChunks;  // (tile, chunk 0)

  // codes: one 16 B piece per thread (NWG * 128 pieces); scales: 16 pieces per warpgroup
  const uint8_t* code_src = p.w_codes + (record + static_cast<size_t>(wg) * kChunks) * detail::kCodeRecord +
                            (tid % 128) * 16;
  const uint8_t* scale_src = p.w_scales + (record + static_cast<size_t>(tid / 16) * kChunks) * detail::kScaleRecord +
                             (tid % 16) * 16;  // used by tid < NWG * 16 only
  // Chunk chunk0 + rel's weights into `stage`: code_c and scale_c (this thread's pointers for chunk
  // chunk0) plus rel chunks, an immediate offset when rel is a constant (the unrolled main loop below).
  const uint8_t* code_c = code_src;
  const uint8_t* scale_c = scale_src;
  auto load_weights = [&](int rel, int stage) {
    detail::cp_async_16(smem + Smem::kCodes + stage * Smem::kCodesStage + tid * 16, code_c + rel * detail::kCodeRecord,
                        true);
    detail::cp_async_16_if(smem + Smem::kScales + stage * Smem::kScalesStage + tid * 16,
                           scale_c + rel * detail::kScaleRecord, tid < NWG * 16);
  };

  // The weights of the first chunks do not depend on the previous kernel on the stream (offsets and
  // weights come from before it; pdl.cuh): under a programmatic dependent launch (moe_down(pdl=True))
  // they stream in while that kernel finishes. They join the first stage's cp.async group below.
  constexpr int kAheadStages = OVERLAP ? STAGES - 2 : STAGES - 1;  // prefetch distance (main loop)
  constexpr int kAhead = kAheadStages * CPS;  // in chunks
  static_assert(kDirect || kAheadStages >= 1, "OVERLAP needs STAGES >= 3");
#pragma unroll
  for (int s = 0; s < kAhead; ++s)
    if (s < kChunks) load_weights(s, s);
  // WDIRECT: this thread's code word quad and its rows' scale bytes of chunks c .. c + WDIRECT - 1, the
  // same bytes the ring's stage would hold at tid * 16 and wg * 256 + (warp_in_wg * 8 + g) * 8
  constexpr int kDirectAhead = kDirect ? WDIRECT : 1;
  uint4 direct_codes[kDirectAhead];
  uint2 direct_scales[kDirectAhead];
  const uint8_t* direct_scale_c = p.w_scales + (record + static_cast<size_t>(wg) * kChunks) * detail::kScaleRecord +
                                  (tid % 128) / 4 * 8;
  if constexpr (kDirect) {
#pragma unroll
    for (int r = 0; r < WDIRECT; ++r) {
      if (r < kChunks) {
        direct_codes[r] = detail::ldg_stream_16<true>(code_c + r * detail::kCodeRecord);
        direct_scales[r] = detail::ldg_stream_8<true>(direct_scale_c + r * detail::kScaleRecord);
      }
    }
  }
  if constexpr (L2_PREFETCH) {
    // The rest of each warpgroup's weight chunks (its kChunks records of codes and of scales are contiguous) into L2
    // now: under a programmatic dependent launch the CTA may get here while the previous kernel still runs (the
    // down GEMM during the gate_up's main loop), and the main loop then reads them from L2 instead of DRAM.
    constexpr int kRequested = kDirect ? WDIRECT : kAhead;  // chunks already on their way (above)
    if (kChunks > kRequested && tid < NWG) {
      const size_t first = record + static_cast<size_t>(tid) * kChunks + kRequested;
      detail::prefetch_l2_bulk(p.w_codes + first * detail::kCodeRecord, (kChunks - kRequested) * detail::kCodeRecord);
      detail::prefetch_l2_bulk(p.w_scales + first * detail::kScaleRecord,
                               (kChunks - kRequested) * detail::kScaleRecord);
    }
  }
  const float s_w = p.w_scale[expert] * dequant::kWeightScaleFold;
  pdl::wait_for_prerequisite_grid();  // the activations, their row scales: the previous kernel's outputs
  CTA_STAMP(2);

  // The token rows in two halves: the source rows now, which the activation copies below need, and the activation
  // row scales (times s_w) and router weights, which only the epilogue reads, stored once those copies are issued (the
  // main loop's first barrier orders them before the epilogue). So the gate_up's first activations wait for one round
  // trip (the row index) instead of two (then the row scale), and the down GEMM's, which has no row index, for none
  // instead of one (its row scales and router weights).
  constexpr int kHeldRows = (TN + kThreads - 1) / kThreads;
  TokenRowLoads held_rows[kHeldRows];
  request_token_rows<TN, kHeldRows, EPI>(p, row0, rows_valid, tid, kThreads, src_rows, held_rows);
  __syncthreads();

  // Each thread's copy sources and destinations are the same for every K chunk but for the chunk
  // offset, so they are computed once here (the decode tiles issue few instructions per chunk, and
  // the compiler cannot hoist the activation gather's shared-memory row lookup by itself).
  // Activations: TN rows x 8 pieces of 16 B per chunk. Same address as &sB(n, 8c, stage): the 128B
  // swizzle XORs the 16 B piece index with the row index within each 1024 B atom (the base is
  // 1024-aligned; tests/test_moe_gemm_codegen.py checks this formula against CuTe's layout).
  constexpr bool kOnePiece = TN * 8 <= kThreads;  // at most one activation piece per thread and chunk
  const __nv_bfloat16* a_src = p.a;
  uint32_t a_dst = 0;
  bool a_valid = false;
  if constexpr (kOnePiece) {
    if (tid < n_mma * 8) {
      const int n = tid >> 3, c = tid & 7;
      const int src = src_rows[n];
      a_valid = src >= 0;  // rows past the expert's end: zero-filled from row 0's (valid) address
      a_src = p.a + (static_cast<size_t>(a_valid ? src : 0) * K + c * 8);
      a_dst = n * 128 + ((c ^ (n & 7)) << 4);
    }
  }
  // More pieces than threads (TN * 8 > kThreads: the prefill tiles). GATHER_PIECES (TileConfig.gather_pieces, on in
  // "auto"'s v1 tiles): piece j of this thread is row tid / 8 + j * kThreads / 8, the same 16 B column tid % 8 of
  // every row, so its destination is piece 0's plus j * kThreads / 8 rows (rows that many apart have the same low
  // three bits, which the swizzle XORs) and its source row is looked up once here. (Looked up per piece and chunk,
  // with 64-bit address math and the loop's bounds, the gather is about half of the 470-660 instructions a warp
  // issues per 128-K stage of the prefill tile; 227-347 with GATHER_PIECES.) Without it: the strided loop below.
  constexpr bool kWholePieces = !kOnePiece && GATHER_PIECES;
  static_assert(!GATHER_PIECES || !kOnePiece, "GATHER_PIECES is for tiles with more activation pieces than threads");
  constexpr int kPieces = kWholePieces ? TN * 8 / kThreads : 1;
  int a_rows[kPieces];   // source rows (0 for rows past the expert's end: zero-filled from a valid address)
  uint32_t a_flags = 0;  // bit 2j: piece j is copied (its row < n_mma); bit 2j + 1: from a valid source row
  if constexpr (kWholePieces) {
    static_assert((TN * 8) % kThreads == 0 && (kThreads / 8) % 8 == 0, "whole pieces per thread, one swizzle");
    const int c = tid & 7;
    a_dst = (tid >> 3) * 128 + ((c ^ ((tid >> 3) & 7)) << 4);
#pragma unroll
    for (int j = 0; j < kPieces; ++j) {
      const int n = (tid >> 3) + j * (kThreads / 8);
      const int src = src_rows[n];
      a_rows[j] = src < 0 ? 0 : src;
      a_flags |= (n < n_mma ? 1u : 0u) << (2 * j) | (src >= 0 ? 2u : 0u) << (2 * j);
    }
  }
  // Chunk chunk0 + rel's activation rows into `stage` (a_c: this thread's pointer for chunk chunk0).
  const __nv_bfloat16* a_c = a_src;
  auto load_activations = [&](int chunk0, int rel, int stage) {
    if constexpr (kOnePiece) {
      if (tid < n_mma * 8)
        detail::cp_async_16(smem + Smem::kB + stage * Smem::kBStage + a_dst, a_c + rel * detail::kChunkK, a_valid);
    } else if constexpr (kWholePieces) {
#pragma unroll
      for (int j = 0; j < kPieces; ++j) {  // rows past n_mma: never read by the wgmmas
        if ((a_flags >> (2 * j)) & 1u)
          detail::cp_async_16(smem + Smem::kB + stage * Smem::kBStage + a_dst + j * (kThreads / 8) * 128,
                              p.a + (static_cast<size_t>(a_rows[j]) * K + (chunk0 + rel) * detail::kChunkK +
                                     (tid & 7) * 8),
                              (a_flags >> (2 * j + 1)) & 1u);
      }
    } else {
      for (int i = tid; i < n_mma * 8; i += kThreads) {  // rows past n_mma: never read by the wgmmas
        const int n = i >> 3, c = i & 7;
        const int src = src_rows[n];
        const __nv_bfloat16* g =
            p.a + (static_cast<size_t>(src < 0 ? 0 : src) * K + (chunk0 + rel) * detail::kChunkK + c * 8);
        detail::cp_async_16(smem + Smem::kB + stage * Smem::kBStage + n * 128 + ((c ^ (n & 7)) << 4), g, src >= 0);
      }
    }
  };
  auto load_stage = [&](int chunk0, int rel, int stage) {
    load_activations(chunk0, rel, stage);
    load_weights(rel, stage);
  };

  // ---- main loop: STAGES-deep cp.async ring of CPS-chunk stages ----
  // OVERLAP = false: wgmma.wait 0 after each chunk; prefetch distance STAGES-1 stages, one cp.async
  // group, wait and CTA barrier per stage.
  // OVERLAP = true: a chunk's wgmmas stay in flight while the next chunk is dequantized into the other
  // A register buffer (even ring slots use tCrA, odd ones tCrA_next; wait 1). The previous stage's
  // wgmmas may still read it when a stage begins, so the ring refills the stage read two stages before:
  // prefetch distance STAGES-2.
  if constexpr (kDirect) {  // the whole K, one group
#pragma unroll
    for (int c = 0; c < kChunks; ++c) load_activations(0, c, c);
    detail::cp_async_commit();
  } else {
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
      if (s < kChunks) load_activations(0, s, s);
      if (s % CPS == CPS - 1) detail::cp_async_commit();
    }
  }
#pragma unroll
  for (int i = 0; i < kHeldRows; ++i) {
    const int n = tid + i * kThreads;
    if (n < TN) {
      store_token_row(held_rows[i], n, token_scale, token_weight);
      // then s_w * s_a in place, read back through a volatile load: its multiply can only follow that store, which
      // ptxas keeps after the copies above (a product of the loaded values went ahead of them). The epilogue then
      // reads the product, as before, and s_w stays out of the main loop's registers.
      volatile float* scale = token_scale + n;
      *scale = s_w * *scale;
    }
  }
  pdl::allow_dependent_launch();  // every CTA is past its prologue: the next kernel may get resident
  const int lane = tid % 32, warp_in_wg = (tid % 128) / 32;
  const int g = lane / 4;
  Tensor tCrA_next = make_fragment_like(tCrA);  // second A buffer (OVERLAP only; dead code otherwise)

  // One K chunk: this thread's 4 code words and its rows' 8 scale bytes -> 4 k16 steps of A registers, then
  // the chunk's wgmmas against ring slot `stage` of the activations, NN columns wide (Int<NN>: TN, or with
  // NSTEP the CTA's n_mma; the same descriptors, since a K-major SW128 tile's first NN rows are those of
  // TN's, and the first NN / 2 accumulator registers).
  // STEP_PIPE: first / last = the chunk is its stage's first / last (see the template's comment).
  auto mma_chunk = [&](const uint4 codes, const uint2 scales, const int stage, auto& frag_a, auto nn,
                       const bool first = true, const bool last = true) {
    constexpr int NN = decltype(nn)::value;
    const uint32_t code_words[4] = {codes.x, codes.y, codes.z, codes.w};
    auto a_u32 = recast<uint32_t>(frag_a);  // (4 regs, 1, 4)
    auto mma_step = [&](const int j) {
      if constexpr (NN == TN) {
        cute::gemm(tiled_mma, frag_a(_, _, j), tCrB(_, _, j, stage), accum);
      } else {
        detail::wgmma_rs_columns<NN>(a_u32(0, 0, j), a_u32(1, 0, j), a_u32(2, 0, j), a_u32(3, 0, j),
                                     recast<uint64_t>(tCrB(_, _, j, stage))(0), accum,
                                     std::make_index_sequence<NN / 2>{});
      }
    };
    if constexpr (STEP_PIPE) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t regs[4];
        dequant::dequant_step(code_words[j], dequant::scale_pair(j < 2 ? scales.x : scales.y, j), regs);
        if (!first) warpgroup_wait<3>();  // the previous chunk's step j, the last reader of these registers
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          warpgroup_fence_operand(a_u32(b, 0, j));
          a_u32(b, 0, j) = regs[b];
          warpgroup_fence_operand(a_u32(b, 0, j));
        }
        warpgroup_arrive();
        mma_step(j);
        warpgroup_commit_batch();
      }
      if (last) {
        warpgroup_wait<0>();
        warpgroup_fence_operand(accum);
      }
      return;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // a0: row r, a1: row r+8, a2: row r k+8, a3: row r+8 k+8
      uint32_t regs[4];
      dequant::dequant_step(code_words[j], dequant::scale_pair(j < 2 ? scales.x : scales.y, j), regs);
#pragma unroll
      for (int b = 0; b < 4; ++b) a_u32(b, 0, j) = regs[b];
    }
    if constexpr (!OVERLAP) warpgroup_fence_operand(accum);
    warpgroup_arrive();
#pragma unroll
    for (int j = 0; j < 4; ++j) mma_step(j);
    warpgroup_commit_batch();
    warpgroup_wait<OVERLAP ? 1 : 0>();
    if constexpr (!OVERLAP) warpgroup_fence_operand(accum);
  };
  // chunk = chunk0 + rel in ring slot `stage` == chunk % kSlots; the caller passes rel and stage as
  // constants where it can (see below), with a_c, code_c, scale_c at chunk0
  auto mainloop_step = [&](const int chunk0, const int rel, const int stage, auto& frag_a, auto nn) {
    const int chunk = chunk0 + rel;
    if (rel % CPS == 0) {  // the first chunk of a ring stage (chunk0 is a multiple of kSlots, so of CPS)
      detail::cp_async_wait<kAheadStages - 1>();
      if constexpr (PROXY_FENCE) detail::fence_proxy_async_shared();
      // this stage landed for every thread; every warpgroup is done with the stage refilled below
      __syncthreads();
      if (chunk == 0) CTA_STAMP(3);
#pragma unroll
      for (int c = 0; c < CPS; ++c) {
        const int next = chunk + kAhead + c;
        if (next < kChunks) load_stage(chunk0, rel + kAhead + c, (stage + kAhead + c) % kSlots);
      }
      detail::cp_async_commit();
    }
    const uint4 codes = *reinterpret_cast<const uint4*>(smem + Smem::kCodes + stage * Smem::kCodesStage + tid * 16);
    const uint2 scales = *reinterpret_cast<const uint2*>(smem + Smem::kScales + stage * Smem::kScalesStage +
                                                         wg * detail::kScaleRecord + (warp_in_wg * 8 + g) * 8);
    mma_chunk(codes, scales, stage, frag_a, nn, rel % CPS == 0, rel % CPS == CPS - 1);
  };
  // Unrolled by the ring's slots: every slot index, and with it each shared-memory offset and wgmma
  // descriptor, is a compile-time constant, and a chunk's global offsets are one base per turn of the ring
  // plus immediates (the decode tiles issue few instructions per chunk besides these). WDIRECT: unrolled by
  // the register buffers, whose index must be constant; the resident activation chunk (and descriptor) is
  // one add per chunk.
  auto main_loop = [&](auto nn) {
    if constexpr (kDirect) {
      // every activation chunk landed for every thread (the one wait and barrier of the CTA)
      detail::cp_async_wait<0>();
      detail::fence_proxy_async_shared();
      __syncthreads();
      CTA_STAMP(3);
      for (int chunk0 = 0; chunk0 < kChunks; chunk0 += WDIRECT) {
#pragma unroll
        for (int r = 0; r < WDIRECT; ++r) {
          const int chunk = chunk0 + r;
          if (kChunks % WDIRECT == 0 || chunk < kChunks) {
            const uint4 codes = direct_codes[r];
            const uint2 scales = direct_scales[r];
            if (chunk + WDIRECT < kChunks) {  // refill the registers just read, WDIRECT chunks ahead
              direct_codes[r] = detail::ldg_stream_16(code_c + (r + WDIRECT) * detail::kCodeRecord);
              direct_scales[r] = detail::ldg_stream_8(direct_scale_c + (r + WDIRECT) * detail::kScaleRecord);
            }
            mma_chunk(codes, scales, chunk, tCrA, nn);
          }
        }
        code_c += WDIRECT * detail::kCodeRecord;
        direct_scale_c += WDIRECT * detail::kScaleRecord;
      }
    } else if constexpr (OVERLAP) {
      // kSlots is even, so a slot's parity is its chunk's and the two A buffers alternate. The wgmmas
      // drain at the end of every turn: with one still in flight across the loop's back edge, or under a
      // run-time "chunk exists" test, ptxas serializes every wgmma of the kernel (C7513 / C7511: a wait
      // after each). So whole turns run in the loop and the K % ring remainder after it.
      constexpr int kTurns = kChunks / kSlots, kRest = kChunks % kSlots;
      auto overlapped_step = [&](const int chunk0, const int s) {
        if (s % 2) {
          mainloop_step(chunk0, s, s, tCrA_next, nn);
        } else {
          mainloop_step(chunk0, s, s, tCrA, nn);
        }
      };
      for (int turn = 0; turn < kTurns; ++turn) {
#pragma unroll
        for (int s = 0; s < kSlots; ++s) overlapped_step(turn * kSlots, s);
        warpgroup_wait<0>();
        warpgroup_fence_operand(accum);
        a_c += kSlots * detail::kChunkK;
        code_c += kSlots * detail::kCodeRecord;
        scale_c += kSlots * detail::kScaleRecord;
      }
#pragma unroll
      for (int s = 0; s < kRest; ++s) overlapped_step(kTurns * kSlots, s);
      warpgroup_wait<0>();
      warpgroup_fence_operand(accum);
    } else {
      for (int chunk0 = 0; chunk0 < kChunks; chunk0 += kSlots) {
#pragma unroll
        for (int s = 0; s < kSlots; ++s)
          if (kChunks % kSlots == 0 || chunk0 + s < kChunks) mainloop_step(chunk0, s, s, tCrA, nn);
        a_c += kSlots * detail::kChunkK;
        code_c += kSlots * detail::kCodeRecord;
        scale_c += kSlots * detail::kScaleRecord;
      }
    }
  };
  // NSTEP: one copy of the main loop per wgmma width, picked once per CTA (a uniform branch), so each copy's
  // wgmmas are straight-line code as without NSTEP.
  if constexpr (NSTEP == 0) {
    main_loop(Int<TN>{});
  } else {
    detail::with_columns<TN, NSTEP>(n_mma, main_loop);
  }
  CTA_STAMP(4);
  detail::cp_async_wait<0>();

  // ---- epilogue: this warp's 16 weight rows x TN tokens (store_warp_tile) ----
  detail::store_warp_tile<N, TN, EPI, (ROW_AMAX || kCluster)>(
      p, [&](int j) { return accum(j); }, token_scale, token_weight, wt * kBlockRows + wg * 64 + warp_in_wg * 16, row0,
      rows_valid, lane, kCluster ? part_amax : p.row_amax, kCluster ? 0 : row0, 1.0f);

  if constexpr (COMBINE_TOPK > 0) {
    // src_rows is free again: the main loop's activation copies have read it
    combine_last_arrivals<N, kBlockRows, TN, COMBINE_TOPK, kThreads>(p, row0, rows_valid, wt, tid, src_rows);
  }
  CTA_STAMP(5);  // thread 0's epilogue stores issued (the other warps' may still be running)

  if constexpr (kCluster) {
    // Every CTA of the cluster has folded its part of each row's amax and stored its h (release / acquire: the parts
    // are visible; h is this CTA's own). Each row's amax is the max of the CLUSTER_Q parts (exact, in any order).
    cluster::arrive_release();
    cluster::wait_acquire();
    for (int n = tid; n < rows_valid; n += kThreads) {
      uint32_t bits = 0;
#pragma unroll
      for (int r = 0; r < CLUSTER_Q; ++r) bits = max(bits, cluster::load_shared_u32(part_amax + n, r));
      row_amax[n] = bits;
    }
    // The other CTAs may leave once every CTA has read their parts: arrive now, wait at the end.
    cluster::arrive_release();
    __syncthreads();  // row_amax for every thread
    // this CTA's columns of h: intermediate wt * kBlockRows / 2 .., kBlockRows / 32 blocks of 16 per row
    quantize_row_blocks_nvfp4<N / 2, kBlockRows / 32, kThreads, 1>(
        p.out, row0, rows_valid, wt * (kBlockRows / 32), tid, [&](int64_t row) { return row_amax[row - row0]; },
        p.q_codes, p.q_block_scales, p.q_scale, p.q_dequant, p.q_mantissa_bits, p.status);
    cluster::wait_acquire();
  } else if constexpr (EPI == Epilogue::SwigluQuant) {
    // The last CTA to finish this token tile quantizes its complete rows of h (order-independent): the
    // barrier orders this CTA's h stores before thread 0's acq_rel arrival (tile_arrival.cuh), the second one
    // hands the verdict, and with it the other CTAs' h, to every thread.
    __syncthreads();
    if (tid == 0) item[1] = (arrive_acq_rel_gpu(&p.tile_counters[y_tile]) == N / kBlockRows - 1);
    __syncthreads();
    if (!item[1]) return;
    if (tid == 0) p.tile_counters[y_tile] = 0;  // ready for the next launch
    if constexpr (ROW_AMAX) {
      constexpr int kBatch = TN >= 64 ? 4 : 1;  // blocks per thread in flight (a 64-register decode tile: one)
      quantize_rows_nvfp4_from_amax<N / 2, kThreads, kBatch>(p.out, row0, rows_valid, tid, p.row_amax, p.q_codes,
                                                             p.q_block_scales, p.q_scale, p.q_dequant,
                                                             p.q_mantissa_bits, p.status);
      __syncthreads();
      clear_row_amax<kThreads>(p.row_amax, row0, rows_valid, tid);
    } else {
      quantize_rows_nvfp4<N / 2, (TN >= 64), kThreads / 32>(p.out, row0, rows_valid, tid / 32, lane, p.q_codes,
                                                            p.q_block_scales, p.q_scale, p.q_dequant,
                                                            p.q_mantissa_bits, p.status);
    }
    CTA_STAMP(6);  // the token tile's last CTA: its rows quantized
  }
}

// out[t, :] = bf16(sum_{j < TOPK} row(slot_rows[t, j])) summed in FP32 in slot order, row() the per-slot rows
// (moe_slot_rows.cuh: values fp16 [M, H], exponents int8 [M, H/2]); one CTA per token, a 16-column block per thread.
template <int H, int TOPK>
__device__ __forceinline__ void moe_combine_device(const __half* __restrict__ values,
                                                   const int8_t* __restrict__ exponents,
                                                   const int32_t* __restrict__ slot_rows,
                                                   __nv_bfloat16* __restrict__ out, int64_t num_tokens) {
  static_assert(H % slot_rows::kBlock == 0, "H % 16 == 0");
  const int64_t t = blockIdx.x;
  CTA_STAMP(0);
  if (t >= num_tokens) return;
  // slot_rows is the routing's, from before the GEMMs: requested ahead of the wait, so the per-slot rows' loads after
  // it wait for no round trip of their own. Under moe_down's launch this kernel starts once every down CTA has passed
  // its own wait (every kernel of the layer waits before it lets the next start), so the routing has completed, as
  // the GEMMs assume of the offsets they read before their waits. Read-only path (ld.global.nc, as the loads after
  // the wait compiled to): with ld.cg instead, moe_combine alone took 1.4-3.5% longer (fifty-seventh session, H100).
  int32_t rows[TOPK];
#pragma unroll
  for (int j = 0; j < TOPK; ++j) rows[j] = __ldg(slot_rows + t * TOPK + j);
  pdl::wait_for_prerequisite_grid();  // the per-slot rows: the down GEMM's output
  CTA_STAMP(2);
  pdl::allow_dependent_launch();
  for (int b = threadIdx.x; b < H / slot_rows::kBlock; b += blockDim.x) {
    slot_rows::combine_block<H, TOPK>(values, exponents, [&](int j) { return rows[j]; }, b,
                                      out + static_cast<size_t>(t) * H);
  }
  CTA_STAMP(5);
}

}  // namespace trace_kernels::moe
