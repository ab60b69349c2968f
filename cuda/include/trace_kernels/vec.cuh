// 16-byte vector loads/stores of 8 elements ("a half block") as FP32, for bf16 / fp16 / fp32.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace trace_kernels {

template <typename T>
struct Vec8;  // 8 contiguous elements of T, loaded with 16-byte accesses

// NaN-propagating max of |x| over 8 elements (16-bit types: packed; abs_max_pair / max_pair /
// fold_pair let a caller fold several Vec8s before the one FP32 conversion).
__device__ __forceinline__ float bf16_bits_to_float(uint32_t u16) { return __uint_as_float(u16 << 16); }

// The members Vec8<__nv_bfloat16> and Vec8<__half> share: the 16-byte accesses and the packed (max.NaN) abs max.
template <typename T, typename Pair>
struct Vec8Packed16 {
  uint4 raw;  // 8 x T
  __device__ __forceinline__ void load(const T* p) { raw = __ldg(reinterpret_cast<const uint4*>(p)); }
  __device__ __forceinline__ void load_stream(const T* p) { raw = __ldcs(reinterpret_cast<const uint4*>(p)); }
  __device__ __forceinline__ void zero() { raw = make_uint4(0, 0, 0, 0); }
  // max |x| of the 8 elements as a packed pair (max.NaN per half; both halves still to be folded)
  __device__ __forceinline__ uint32_t abs_max_pair() const {
    Pair m = __hmax2_nan(__habs2(as_pair(raw.x)), __habs2(as_pair(raw.y)));
    m = __hmax2_nan(m, __habs2(as_pair(raw.z)));
    return bits(__hmax2_nan(m, __habs2(as_pair(raw.w))));
  }
  static __device__ __forceinline__ uint32_t max_pair(uint32_t a, uint32_t b) {
    return bits(__hmax2_nan(as_pair(a), as_pair(b)));
  }
  // max of a pair's two halves (NaN wins) as FP32: exact, one swap, one packed max, one conversion
  static __device__ __forceinline__ float fold_pair(uint32_t m) {
    const Pair p = as_pair(m);
    return __low2float(__hmax2_nan(p, __lowhigh2highlow(p)));
  }
  __device__ __forceinline__ float abs_max() const { return fold_pair(abs_max_pair()); }
  static __device__ __forceinline__ uint32_t bits(Pair p) { return *reinterpret_cast<const uint32_t*>(&p); }
  static __device__ __forceinline__ Pair as_pair(uint32_t u) {
    Pair p;
    *reinterpret_cast<uint32_t*>(&p) = u;
    return p;
  }
};

template <>
struct Vec8<__nv_bfloat16> : Vec8Packed16<__nv_bfloat16, __nv_bfloat162> {
  __device__ __forceinline__ void to_float(float (&f)[8]) const {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // bf16 -> fp32 is a 16-bit shift: exact
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
    }
  }
};

template <>
struct Vec8<__half> : Vec8Packed16<__half, __half2> {
  __device__ __forceinline__ void to_float(float (&f)[8]) const {
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 v = __half22float2(as_pair(w[i]));
      f[2 * i] = v.x;
      f[2 * i + 1] = v.y;
    }
  }
};

template <>
struct Vec8<float> {
  float4 lo, hi;
  __device__ __forceinline__ void load(const float* p) {
    lo = __ldg(reinterpret_cast<const float4*>(p));
    hi = __ldg(reinterpret_cast<const float4*>(p) + 1);
  }
  __device__ __forceinline__ void load_stream(const float* p) {
    lo = __ldcs(reinterpret_cast<const float4*>(p));
    hi = __ldcs(reinterpret_cast<const float4*>(p) + 1);
  }
  __device__ __forceinline__ void zero() { lo = hi = make_float4(0.f, 0.f, 0.f, 0.f); }
  __device__ __forceinline__ float abs_max() const {
    float f[8];
    to_float(f);
    float a = fabsf(f[0]);
#pragma unroll
    for (int j = 1; j < 8; ++j) {
      const float b = fabsf(f[j]);
      a = a != a ? a : (b != b ? b : fmaxf(a, b));  // NaN wins
    }
    return a;
  }
  __device__ __forceinline__ void to_float(float (&f)[8]) const {
    f[0] = lo.x; f[1] = lo.y; f[2] = lo.z; f[3] = lo.w;
    f[4] = hi.x; f[5] = hi.y; f[6] = hi.z; f[7] = hi.w;
  }
};

// FP32 -> T with round to nearest even, 8 elements, one 16-byte store (two for fp32).
template <typename T>
__device__ __forceinline__ void store8(T* p, const float (&f)[8]);

template <>
__device__ __forceinline__ void store8<__nv_bfloat16>(__nv_bfloat16* p, const float (&f)[8]) {
  uint4 out;
  uint32_t* w = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    w[i] = *reinterpret_cast<const uint32_t*>(&h);
  }
  *reinterpret_cast<uint4*>(p) = out;
}

template <>
__device__ __forceinline__ void store8<__half>(__half* p, const float (&f)[8]) {
  uint4 out;
  uint32_t* w = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __half2 h = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
    w[i] = *reinterpret_cast<const uint32_t*>(&h);
  }
  *reinterpret_cast<uint4*>(p) = out;
}

template <>
__device__ __forceinline__ void store8<float>(float* p, const float (&f)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(f[0], f[1], f[2], f[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(f[4], f[5], f[6], f[7]);
}

}  // namespace trace_kernels
