// Diagnostic per-CTA timeline (profiling/decode_timeline.py, profiling/moe_timeline.py): with
// TRACE_KERNELS_CTA_TIMELINE defined, thread 0 of every CTA stores %globaltimer (ns, comparable across SMs) and clock64
// (this SM's cycles) at a few points of its life into a device array the scripts read back by name. Without the macro
// CTA_STAMP and CTA_NOTE are empty and the kernels compile to the same SASS as without them, so the stamps cost nothing
// in a normal build.
#pragma once

#ifdef TRACE_KERNELS_CTA_TIMELINE
#include <stdint.h>

#ifndef TRACE_KERNELS_CTA_TIMELINE_MAX_CTAS
#define TRACE_KERNELS_CTA_TIMELINE_MAX_CTAS 65536  // a prefill MoE GEMM's grid: up to ~37K CTAs on Qwen3-235B-A22B
#endif

namespace trace_kernels::timeline {

constexpr int kMaxCtas = TRACE_KERNELS_CTA_TIMELINE_MAX_CTAS;  // CTAs past this are not recorded
constexpr int kSlots = 16;  // per CTA: globaltimer at points 0..6, smid at 7, clock64 at 8..14, a value at 15

}  // namespace trace_kernels::timeline

// [kMaxCtas][kSlots], looked up by this name (extern "C": no mangling) with cuModuleGetGlobal.
extern "C" __device__ unsigned long long trace_kernels_cta_timeline[trace_kernels::timeline::kMaxCtas *
                                                                     trace_kernels::timeline::kSlots];

namespace trace_kernels::timeline {

__device__ __forceinline__ unsigned long long* cta_row() {
  const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  return cta < kMaxCtas ? trace_kernels_cta_timeline + cta * kSlots : nullptr;
}

// Point `i` (0..6) of this CTA's life, recorded by thread 0.
__device__ __forceinline__ void stamp(int i) {
  if (threadIdx.x != 0) return;
  unsigned long long* row = cta_row();
  if (row == nullptr) return;
  unsigned long long ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  row[i] = ns;
  row[8 + i] = static_cast<unsigned long long>(clock64());
  if (i == 0) {
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    row[7] = smid;
  }
}

// A value of the CTA (e.g. its tile count) in slot 15.
__device__ __forceinline__ void note(unsigned long long value) {
  unsigned long long* row = cta_row();
  if (threadIdx.x == 0 && row != nullptr) row[15] = value;
}

}  // namespace trace_kernels::timeline

#define CTA_STAMP(i) ::trace_kernels::timeline::stamp(i)
#define CTA_NOTE(v) ::trace_kernels::timeline::note(v)
#else
#define CTA_STAMP(i) ((void)0)
#define CTA_NOTE(v) ((void)0)
#endif
