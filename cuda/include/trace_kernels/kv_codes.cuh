// Device side of the NVFP4 KV cache's code layout (python/trace_kernels/kv_codes.py is the reference).
//
// A cache row's codes are 32-bit words of 8 elements. Word x keeps elements 0, 2, 4, 6 in its low
// 16-bit lane and 1, 3, 5, 7 in its high lane, each lane GF(2)-encoded so that decode attention gets
// the FP16 pair (element 2j, element 2j + 1) = value(code) * 2^-14 with at most two shifts and one LOP3:
//   f0 = x & M   f1 = (x << 3) & M   f2 = ((x << 1) ^ (x << 6)) & M   f3 = ((x << 2) ^ (x << 9)) & M
// M = 0x8E00 per lane: the sign at bit 15, the code's e1 e0 m at bits 11..9, i.e. an FP16 whose
// exponent is the code's exponent (code 0.5 becomes the subnormal 2^-15). Left shifts of at most 9
// never carry a bit across lanes, so a lane decodes alone: byte-permuting the low (high) lanes of two
// tokens' words into one word decodes straight into pairs of the two tokens, which is P.V's operand.
#pragma once

#include <cstdint>

namespace trace_kernels::kv_codes {

constexpr uint32_t kFieldMask = 0x8E008E00u;  // kv_codes.FIELD_MASK
constexpr float kValueFold = 16384.f;          // f_j as FP16 = value(code) / kValueFold

// The FP16 pairs (element 2j, element 2j + 1) of word x, j = 0..3 (kv_codes.REGISTER_SHIFTS).
__device__ __forceinline__ void fields(uint32_t x, uint32_t (&f)[4]) {
  f[0] = x & kFieldMask;
  f[1] = (x << 3) & kFieldMask;
  f[2] = ((x << 1) ^ (x << 6)) & kFieldMask;
  f[3] = ((x << 2) ^ (x << 9)) & kFieldMask;
}

// The stored word's bits set by magnitude bit t (0: m, 1: e0, 2: e1) of pair j, as a 16-bit pattern
// that both lanes share (kv_codes' encode columns), and the right shift that takes pair j's sign bits
// 15 / 31 to theirs (a sign bit sets one stored bit).
__device__ constexpr uint32_t kMagnitudeColumns[4][3] = {
    {0x4214u, 0x0420u, 0x0800u}, {0x2040u, 0x0081u, 0x010Au}, {0x0008u, 0x0010u, 0x0020u}, {0x0001u, 0x0002u, 0x0004u}};
__device__ constexpr int kSignShift[4] = {0, 3, 1, 2};

// Stored word of 8 elements from a quantizer's classification of its pairs (pair j = elements 2j,
// 2j + 1 in the low / high 16 bits): per-half masks (0xFFFF or 0) of the magnitude index bits
// k2 k1 k0, and the signs at bits 15 / 31. By linearity, the XOR of each set bit's columns.
__device__ __forceinline__ uint32_t encode_classes(const uint32_t (&k2)[4], const uint32_t (&k1)[4],
                                                   const uint32_t (&k0)[4], const uint32_t (&sign)[4]) {
  uint32_t x = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    x ^= (sign[j] >> kSignShift[j]) ^ (k0[j] & (kMagnitudeColumns[j][0] * 0x10001u));
    x ^= (k1[j] & (kMagnitudeColumns[j][1] * 0x10001u)) ^ (k2[j] & (kMagnitudeColumns[j][2] * 0x10001u));
  }
  return x;
}

// nvfp4 code word (element e in nibble e) -> the FP16 fields above, spelled out (no encoding).
__device__ __forceinline__ uint32_t nibble_fields(uint32_t nibbles, int j) {
  const uint32_t lo = nibbles >> (8 * j), hi = lo >> 4;  // elements 2j, 2j + 1 in bits 0..3
  return ((lo & 7u) << 9) | ((lo & 8u) << 12) | ((hi & 7u) << 25) | ((hi & 8u) << 28);
}

// nvfp4 code word -> stored word: the inverse of fields(), solved bit by bit (per lane: bits 9-11, 15
// are f0; 6-8, 12 are f1 >> 3; then f2 gives bits 3-5, 14 and f3 bits 0-2, 13 from those).
__device__ __forceinline__ uint32_t encode(uint32_t nibbles) {
  const uint32_t f0 = nibble_fields(nibbles, 0), f1 = nibble_fields(nibbles, 1);
  const uint32_t f2 = nibble_fields(nibbles, 2), f3 = nibble_fields(nibbles, 3);
  const uint32_t k = f0 | (f1 >> 3);
  const uint32_t x2 = (((f2 >> 6) ^ (k >> 5)) & 0x00380038u) | (((f2 >> 1) ^ (k << 5)) & 0x40004000u);
  const uint32_t x3 = (((f3 >> 9) ^ (k >> 7)) & 0x00070007u) | (((f3 >> 2) ^ (k << 7)) & 0x20002000u);
  return k | x2 | x3;
}

}  // namespace trace_kernels::kv_codes
