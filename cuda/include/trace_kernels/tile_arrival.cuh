// A CTA's (or a warp group's) arrival on a GPU-scope counter, for the "last one to arrive does the work" epilogues
// (the fused SwiGLU epilogue's last CTA of a token tile, moe_gemm.cuh and moe_gemm_ws.cuh).
//
// Call it from one thread after a barrier that ordered the group's stores before it (__syncthreads, a named
// barrier, or an mbarrier wait). The atomic's release half publishes those stores (a release is cumulative over
// what the barrier made this thread observe; CUTLASS's GenericBarrier relies on the same pattern) and its acquire
// half lets the last arriver read every earlier arriver's stores once a barrier hands its verdict to the group.
// It compiles to MEMBAR.ALL.GPU + ATOMG + CCTL.IVALL, where __threadfence() + atomicAdd issue the sequentially
// consistent MEMBAR.SC.GPU (nvcc 13.0, sm_90a).
#pragma once

#include <cstdint>

namespace trace_kernels {

// Adds one to *counter (global memory) with acq_rel semantics at GPU scope; returns the value before.
__device__ __forceinline__ int32_t arrive_acq_rel_gpu(int32_t* counter) {
  int32_t before;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;\n" : "=r"(before) : "l"(counter) : "memory");
  return before;
}

}  // namespace trace_kernels
