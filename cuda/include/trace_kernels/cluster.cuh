// Thread-block cluster primitives (sm_90): the cluster barrier and reads of another CTA's shared memory
// (distributed shared memory). Used by the fused SwiGLU epilogue whose token tile's CTAs form one cluster
// (moe_gemm.cuh, CLUSTER_Q): each CTA folds its part of every row's amax into its own shared memory, and after
// the barrier every CTA reads the others' parts, so no row amax makes a round trip through global memory.
#pragma once

#include <cstdint>

namespace trace_kernels::cluster {

// Every thread of every CTA of the cluster arrives (all threads of a warp together: .aligned). Release: this
// thread's earlier writes, shared and global, are visible to the threads that wait on this phase.
__device__ __forceinline__ void arrive_release() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}

// Waits until every thread of the cluster has arrived on the current phase; acquire: their writes before the arrival
// are visible after it.
__device__ __forceinline__ void wait_acquire() {
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

// The 32-bit word at `local` (an address in this CTA's shared memory) in the shared memory of the cluster's CTA
// `rank`, whose layout is the same.
__device__ __forceinline__ uint32_t load_shared_u32(const uint32_t* local, uint32_t rank) {
  const uint32_t cta_addr = static_cast<uint32_t>(__cvta_generic_to_shared(local));
  uint32_t cluster_addr, value;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(cluster_addr) : "r"(cta_addr), "r"(rank));
  asm volatile("ld.shared::cluster.u32 %0, [%1];\n" : "=r"(value) : "r"(cluster_addr) : "memory");
  return value;
}

}  // namespace trace_kernels::cluster
