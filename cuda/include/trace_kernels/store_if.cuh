// Global stores under a PTX predicate, with no branch around them (the MoE GEMMs' epilogues).
//
// A C++ `if (n < rows_valid) { ...; *dst = v; }` per token column compiles to one branch-guarded block per column
// (BSSY / @P BRA / BSYNC), and ptxas does not move work across those blocks: each column's shared-memory load, MUFU
// chain and store wait for the previous column's. The prefill tiles' 32 columns per thread made the epilogue a serial
// chain of ~150-cycle blocks (4.8 us of a 28 us CTA life, profiling/moe_timeline.py, fifty-ninth session). With the
// value computed for every column and only the store predicated, the columns are straight-line code that ptxas
// interleaves. Like cp_async_16_if, these carry no "memory" clobber: the epilogues order them with barriers and fences.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>

namespace trace_kernels {

__device__ __forceinline__ void store_global_if(__nv_bfloat16* dst, __nv_bfloat16 v, bool pred) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p st.global.b16 [%0], %1;\n}\n"
               ::"l"(dst), "h"(__bfloat16_as_ushort(v)), "r"(static_cast<int>(pred)));
}

__device__ __forceinline__ void store_global_if(uint32_t* dst, uint32_t v, bool pred) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p st.global.b32 [%0], %1;\n}\n"
               ::"l"(dst), "r"(v), "r"(static_cast<int>(pred)));
}

__device__ __forceinline__ void store_global_if(int8_t* dst, int8_t v, bool pred) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p st.global.b8 [%0], %1;\n}\n"
               ::"l"(dst), "h"(static_cast<unsigned short>(static_cast<uint8_t>(v))), "r"(static_cast<int>(pred)));
}

}  // namespace trace_kernels
