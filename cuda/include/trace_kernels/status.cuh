// Device-side status word: kernels report non-finite input here instead of writing finite garbage.
//
// Layout (4 x uint32, 16-byte aligned, zeroed / first = ~0 by the host):
//   [0] op bits that saw non-finite input  [1] count of non-finite elements (saturating)
//   [2..3] uint64 (row << 32 | column) of the first one (atomicMin => the lowest row, then column)
#pragma once

#include <stdint.h>

#include "trace_kernels/nvfp4.cuh"

namespace trace_kernels {

// One bit per reporting op (trace_kernels.ops._common.STATUS_OPS names them; a CPU test checks both
// lists agree). refit_weights_packed_ reports on refit's bit: same input, same rows.
enum StatusOp : uint32_t {
  kStatusQuantize = 1u,
  kStatusGuidedFakeQuantize = 2u,
  kStatusRefitWeights = 4u,
  kStatusMoeGateUp = 8u,    // the MoE GEMM's fused SwiGLU epilogue (moe_nvfp4_row.cuh)
  kStatusKvAppend = 16u,    // kv_append (kv_append.cuh)
};

// Record the non-finite elements among 8 values at (row, col0..col0+7). Slow path: only called
// when a block's NaN-propagating amax is not finite.
__device__ __forceinline__ void report_nonfinite(uint32_t* status, uint32_t op, uint64_t row, uint32_t col0,
                                              const float (&v)[8]) {
  uint32_t count = 0;
  uint32_t first = 8;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if (!nvfp4::is_finite(v[j])) {
      ++count;
      first = first < 8 ? first : j;
    }
  }
  if (count == 0) return;
  atomicOr(status, op);
  atomicAdd(status + 1, count);
  atomicMin(reinterpret_cast<unsigned long long*>(status + 2),
            static_cast<unsigned long long>((row << 32) | (col0 + first)));
}

}  // namespace trace_kernels
