// The parameters of every decode kernel (attention_decode*.cuh) and the split plan they read.
//
// Fields are only ever added at the end: profiling/decode_ab.py runs kernels built from older header trees with the
// current Python launcher, and a kernel reads only the prefix its own struct declares.
#pragma once

#include <cuda_bf16.h>
#include <stdint.h>

namespace trace_kernels {

struct DecodeParams {
  const __nv_bfloat16* q;      // [B, Hq, D]
  const uint8_t* k_codes;      // NVFP4: [slots, Hkv, D/2]; BF16: data [slots, Hkv, D]
  const uint8_t* v_codes;
  const uint8_t* k_block_scales;  // [slots, Hkv, D/16] e4m3 (NVFP4 only)
  const uint8_t* v_block_scales;
  const float* k_scale;        // [slots, Hkv] (NVFP4 only)
  const float* v_scale;
  const int* block_table;      // [B, max_pages]
  const int* lengths;          // [B]
  __nv_bfloat16* out;          // [B, Hq, D] (single split)
  float* o_part;               // [B, Hq, S, D] (several splits)
  float* lse_part;             // [B, Hq, S]
  int max_pages;
  int tiles_per_split;         // splits [0, long_splits): tiles of TT tokens each
  float scale_log2;            // softmax scale * log2(e)
  int long_splits;             // == S: even plan; < S: uneven (attention.plan_splits), grid order split-major
  int short_tiles;             // tiles of splits [long_splits, S)
  // null: a decode_attention_combine launch merges the splits. Else int32 [2, B x gridDim.x], zero on entry and left
  // zero: the last combine_ctas CTAs of each (sequence, blockIdx.x) to finish merge them (attention_split_combine.cuh).
  int* combine_counters;
  int combine_ctas;
};

// The (split, sequence) a CTA of grid (CTAs per split, S, B) works on. An even plan keeps the grid's own
// order. An uneven plan reads it split-major: the hardware places the first CTAs of the grid one per SM
// and those run faster than the ones placed beside them (docs/kv_cache.md), so its long splits go first.
struct DecodeCta {
  int split;
  int b;
};

__host__ __device__ __forceinline__ DecodeCta decode_cta(const DecodeParams& p, int y, int z, int splits,
                                                         int batch) {
  if (p.long_splits >= splits) return {y, z};
  const int linear = y + splits * z;
  return {linear / batch, linear % batch};
}

__device__ __forceinline__ DecodeCta decode_cta(const DecodeParams& p) {
  return decode_cta(p, blockIdx.y, blockIdx.z, gridDim.y, gridDim.z);
}

// The first tile and the tile count of a split under the plan in p.
struct SplitTiles {
  int first;
  int count;
};

__host__ __device__ __forceinline__ SplitTiles split_tiles(const DecodeParams& p, int split) {
  if (split < p.long_splits) return {split * p.tiles_per_split, p.tiles_per_split};
  return {p.long_splits * p.tiles_per_split + (split - p.long_splits) * p.short_tiles, p.short_tiles};
}

}  // namespace trace_kernels
