// Programmatic dependent launch (PDL, sm_90+). A kernel launched with the programmatic stream
// serialization attribute (runtime: CudaKernel.launch(..., pdl=True)) may start while the kernel
// before it on the stream is still running; what it does before wait_for_prerequisite_grid() must
// not read anything that kernel writes. Both calls cost one instruction and do nothing for a kernel
// launched normally, so every kernel of a PDL chain calls them unconditionally.
#pragma once

namespace trace_kernels::pdl {

// Blocks until the previous kernel on the stream has completed and its writes are visible.
__device__ __forceinline__ void wait_for_prerequisite_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets the next PDL-launched kernel start once every CTA of this grid has called this (or exited);
// that kernel still waits for this one to complete before it reads this one's outputs.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace trace_kernels::pdl
