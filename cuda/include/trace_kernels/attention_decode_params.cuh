// The parameters of every decode kernel (attention_decode*.cuh).
//
// Add fields only at the end: profiling/decode_ab.py runs kernels built from older header trees with the current
// Python launcher, and a kernel reads only the prefix its own struct declares. (The four fields that the uneven split
// plan and the in-kernel split merge appended went with them on 2026-12-05, so trees from 8aaeda6 to 547b8ce no longer
// match this launcher; 3020219 and earlier do.)
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
  int tiles_per_split;         // split s covers tiles [s x tiles_per_split, (s + 1) x tiles_per_split) of TT tokens
  float scale_log2;            // softmax scale * log2(e)
};

}  // namespace trace_kernels
