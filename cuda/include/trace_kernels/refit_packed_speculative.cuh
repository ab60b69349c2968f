// refit_weights_packed_'s speculative variant: refit v8's guess (the previous sync's expert scale) applied to the
// packed, encoded layout, so that a sync in which no expert's amax moved reads the weights once.
//
// Three launches of one kernel (ops/refit_packed.py), the second and third programmatic dependents of the one before:
// phase 1 (persistent, refit_packed.cuh's record loop): per record, the warp's amax of its 64 x 64 elements goes to a
//   word of its own; the record is packed with the expert's guess g = scales[e] unless g is no positive finite scale
//   or the record's own amax disproves it (RN(amax / 2688) > g: the scale is monotone in the amax) or is NaN/Inf.
//   Nothing is zeroed: every word is written by every call.
// phase 2 (grid E): reduces expert e's record words; it keeps g exactly when RN(amax / 2688) == g, and then every
//   record of phase 1 wrote the reference's bytes.
// phase 3 (persistent): visits only the records of the experts that did not keep their guess and packs them with the
//   exact scale (scales[e] included), or, for a non-finite expert, reports its bad elements and sets every block scale
//   of it to the encoded E4M3 NaN: phase 1 may have packed part of it, so its previous weights are gone (the
//   non-speculative variant leaves them as they were).
// Workspace (int32 words, ws_* below): [0, E) the guesses, [E, 3 E) phase 2's amax bits and verdict (1: repack) per
// expert, [3 E, 3 E + records) the record amax bits in natural record order.
#pragma once

#include "trace_kernels/pdl.cuh"
#include "trace_kernels/refit_packed.cuh"
#include "trace_kernels/refit_weights_speculative.cuh"

namespace trace_kernels::refit_packed {

__device__ __forceinline__ uint32_t* ws_guesses(uint32_t* ws) { return ws; }
__device__ __forceinline__ uint32_t* ws_settled(uint32_t* ws, int experts) { return ws + experts; }
__device__ __forceinline__ uint32_t* ws_records(uint32_t* ws, int experts) { return ws + 3 * experts; }

// The warp's amax (NaN wins) of the record in a stage buffer: lane L reads the two tile rows it packs, and keeps the
// amax of each of its blocks in block_amax[h][j] for pack_record.
template <class Cfg>
__device__ __forceinline__ float record_amax(const uint8_t* stage, int lane, float (&block_amax)[2][kChunkK / 16]) {
  const int r0 = 16 * (lane >> 3) + (lane & 7);
  float amax = 0.f;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int j = 0; j < kChunkK / 16; ++j) {
      const auto lo = load_half_block<Cfg>(stage, r0 + 8 * h, 2 * j);
      const auto hi = load_half_block<Cfg>(stage, r0 + 8 * h, 2 * j + 1);
      block_amax[h][j] = block16_abs_max<typename Cfg::T>(lo, hi);
      amax = nvfp4::fmax_nan(amax, block_amax[h][j]);
    }
  }
  return warp_amax_nan(amax);
}

template <class Cfg>
__device__ __forceinline__ void speculate_pack(const typename Cfg::T* __restrict__ w, uint8_t* __restrict__ codes,
                                               uint8_t* __restrict__ block_scales, const float* __restrict__ scales,
                                               uint32_t* __restrict__ ws, const moe_pack::EncodeColumns& columns,
                                               uint32_t (&table)[4][256], uint8_t* stages, int experts, int n, int k,
                                               int records) {
  pdl::allow_dependent_launch();  // phase 2 may become resident once every CTA has started; it waits for them all
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint32_t* record_words = ws_records(ws, experts);
  int expert = -1;
  float guess = 0.f;
  RefitExpertScale x{};
  for_each_record<Cfg>(
      w, stages + warp * Cfg::STAGES * Cfg::kRecordBytes, n, k, records, [](int i) { return i; },
      [&] {
        moe_pack::build_encode_tables(columns, table, threadIdx.x, kThreads);
        __syncthreads();
      },
      [&](const uint8_t* stage, const Record& rc, int64_t rec) {
        if (rc.e != expert) {  // warp-uniform
          expert = rc.e;
          guess = __ldg(scales + rc.e);
          x = refit_scale_of(guess);
        }
        float block_amax[2][kChunkK / 16];
        const float amax = record_amax<Cfg>(stage, lane, block_amax);
        if (lane == 0) {
          record_words[rec] = __float_as_uint(amax) & 0x7fffffffu;  // NaN bits stay above every finite amax
          if (rc.t == 0 && rc.c == 0) ws_guesses(ws)[rc.e] = __float_as_uint(guess);
        }
        if (!refit_guess_valid(guess) || !nvfp4::is_finite(amax) || __fdiv_rn(amax, nvfp4::kGlobalDivisor) > guess)
          return;  // phase 3 packs this expert
        if (x.fast) pack_record<Cfg, true>(stage, table, codes, block_scales, rec, x, lane, block_amax);
        else pack_record<Cfg, false>(stage, table, codes, block_scales, rec, x, lane, block_amax);
      });
}

// Phase 2, CTA e: expert e's amax bits and whether phase 3 must repack it (its guess did not hold).
__device__ __forceinline__ void settle_experts(uint32_t* __restrict__ ws, int experts, int records_per_expert) {
  __shared__ float warp_amax[kWarps];
  pdl::allow_dependent_launch();
  pdl::wait_for_prerequisite_grid();  // phase 1's words
  const int e = blockIdx.x;
  const uint32_t* words = ws_records(ws, experts) + static_cast<int64_t>(e) * records_per_expert;
  float amax = warp_amax_nan(thread_amax_of_words<kThreads>(words, records_per_expert));
  if (threadIdx.x % 32 == 0) warp_amax[threadIdx.x / 32] = amax;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int i = 1; i < kWarps; ++i) amax = nvfp4::fmax_nan(amax, warp_amax[i]);
  const float guess = __uint_as_float(__ldcg(ws_guesses(ws) + e));
  const bool held = nvfp4::is_finite(amax) && refit_guess_valid(guess) &&
                    __fdiv_rn(amax, nvfp4::kGlobalDivisor) == guess;
  ws_settled(ws, experts)[2 * e] = __float_as_uint(amax);
  ws_settled(ws, experts)[2 * e + 1] = held ? 0u : 1u;  // 1: phase 3 repacks it (refit_next_failed_expert)
}

// Phase 3: the records of the experts whose guess did not hold, packed with their exact scale.
template <class Cfg>
__device__ __forceinline__ void repack_experts(const typename Cfg::T* __restrict__ w, uint8_t* __restrict__ codes,
                                               uint8_t* __restrict__ block_scales, float* __restrict__ scales,
                                               uint32_t* __restrict__ ws, const moe_pack::EncodeColumns& columns,
                                               uint32_t (&table)[4][256], uint8_t* stages, int experts, int n, int k,
                                               int records, uint32_t* __restrict__ status) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  moe_pack::build_encode_tables(columns, table, threadIdx.x, kThreads);  // before waiting: it reads no output
  pdl::wait_for_prerequisite_grid();
  __syncthreads();
  const uint32_t* settled = ws_settled(ws, experts);
  const int per_expert = records / experts, stride = gridDim.x * kWarps;
  // The first index >= i (same residue mod stride) whose expert must be repacked, past kept experts in one jump
  // (expert f's records are at indices >= records - (f + 1) * per_expert); the warp reads 32 verdicts per load.
  const auto next = [&](int i) {
    while (i < records) {
      const int e = (records - 1 - i) / per_expert;
      const int failed = refit_next_failed_expert(settled, e);
      if (failed < 0) return records;
      if (failed == e) return i;
      i += (records - (failed + 1) * per_expert - i + stride - 1) / stride * stride;
    }
    return i;
  };
  int expert = -1;
  RefitExpertScale x{};
  uint2 nan_scales = make_uint2(0u, 0u);
  for_each_record<Cfg>(
      w, stages + warp * Cfg::STAGES * Cfg::kRecordBytes, n, k, records, next, [] {},
      [&](const uint8_t* stage, const Record& rc, int64_t rec) {
        if (rc.e != expert) {  // warp-uniform
          expert = rc.e;
          x = refit_expert_scale(__uint_as_float(__ldcg(settled + 2 * rc.e)));
          const uint32_t nan_byte = moe_pack::encode_scale(0x7f);  // E4M3 NaN, as the MoE GEMM decodes scales
          nan_scales.x = nan_scales.y = nan_byte * 0x01010101u;
        }
        if (x.finite && rc.t == 0 && rc.c == 0 && lane == 0) scales[rc.e] = x.s;
        pack_or_report<Cfg>(stage, table, codes, block_scales, rec, rc, x, n, lane, status);
        if (!x.finite) *reinterpret_cast<uint2*>(block_scales + rec * kScaleRecord + 8 * lane) = nan_scales;
      });
}

// The kernel body of the speculative variant: phase 1, 2 or 3 (above).
template <class Cfg>
__device__ __forceinline__ void speculative_pack(const typename Cfg::T* __restrict__ w, uint8_t* __restrict__ codes,
                                                 uint8_t* __restrict__ block_scales, float* __restrict__ scales,
                                                 uint32_t* __restrict__ ws, const moe_pack::EncodeColumns& columns,
                                                 int n, int k, int records, int experts, int phase,
                                                 uint32_t* __restrict__ status) {
  extern __shared__ __align__(128) uint8_t stages[];  // [kWarps][STAGES][kRecordBytes] (phases 1 and 3)
  __shared__ uint32_t table[4][256];                  // the encoding tables (phases 1 and 3)
  if (phase == 1)
    speculate_pack<Cfg>(w, codes, block_scales, scales, ws, columns, table, stages, experts, n, k, records);
  else if (phase == 2)
    settle_experts(ws, experts, records / experts);
  else
    repack_experts<Cfg>(w, codes, block_scales, scales, ws, columns, table, stages, experts, n, k, records, status);
}

}  // namespace trace_kernels::refit_packed
