// Where one layer's NVFP4 K (or V) pages live, as the kernels that write and read them take it.
#pragma once

#include <stdint.h>

namespace trace_kernels {

// codes [slots, Hkv, D/2], block scales [slots, Hkv, D/16] (E4M3), row scales [slots, Hkv]; slots = pages * P.
struct Nvfp4PagePtrs {
  uint8_t* codes;
  uint8_t* block_scales;
  float* scale;
};

}  // namespace trace_kernels
