// Natural per-expert NVFP4 -> the MoE GEMM's packed, encoded weights (moe_layout.MoEWeights): the
// RL weight sync's second step after refit_weights. The torch path of moe_layout.store_fragments_ is
// the reference (bit for bit); python/trace_kernels/moe_encoding.py documents the encoding.
//
// One thread per encoded 32-bit code word: thread i = 32w + 4g + q of a record's 128 fragment
// threads, k16 step j. Its fragment word holds byte 2kh + h = codes of row r(h) = 16w + 8h + g of
// the 64-row tile, elements k, k+1 with k = 64c + 16j + 8kh + 2q (byte 32c + 8j + 4kh + q of the
// natural row); bytes of zero-scale blocks are stored as 0. The encoded word is the XOR of the
// encode columns of its set bits, through four byte tables in shared memory. Threads with q = 0
// also write the two encoded scale bytes (rows r(0), r(1), block 4c + j).
// GROUPS = 2: the natural rows are [gate; up] halves, interleaved by 8 (moe_layout.interleave_gate_up):
// tile row 64t + 16w + 8h + g is natural row h * N/2 + 32t + 8w + g.
#pragma once

#include <cstdint>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace trace_kernels::moe_pack {

constexpr int kThreads = 256;
constexpr int kWordsPerRecord = 512;  // 2048 code bytes per (64-row tile, 64-K chunk)

struct EncodeColumns {
  uint32_t column[32];  // encoded word of fragment-word bit b (moe_encoding._columns()[1])
};

// E4M3 scale byte (non-negative, finite) -> bits 14..7 of fp16(b * 2^7) (moe_encoding.encode_scales).
__device__ __forceinline__ uint8_t encode_scale(uint8_t b) {
  const __half_raw raw = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b), __NV_E4M3);
  const float value = __half2float(__half(raw)) * 128.0f;  // exact: 4 significant bits, within fp16's range
  return static_cast<uint8_t>((__half_as_ushort(__float2half_rn(value)) >> 7) & 0xFF);
}

// table[byte][v] = the encoded word of value v in fragment byte `byte` (XOR of the encode columns
// of v's set bits), built by the CTA's threads; the caller syncs before reading it.
__device__ __forceinline__ void build_encode_tables(const EncodeColumns& columns, uint32_t (&table)[4][256],
                                                    int tid, int threads) {
  for (int v = tid; v < 256; v += threads) {
#pragma unroll
    for (int byte = 0; byte < 4; ++byte) {  // constant parameter indices: no local copy of the columns
      uint32_t acc = 0;
#pragma unroll
      for (int b = 0; b < 8; ++b)
        if ((v >> b) & 1) acc ^= columns.column[8 * byte + b];
      table[byte][v] = acc;
    }
  }
}

template <int GROUPS>
__device__ __forceinline__ void pack_kernel(const uint8_t* __restrict__ codes, const uint8_t* __restrict__ scales,
                                            uint8_t* __restrict__ out_codes, uint8_t* __restrict__ out_scales,
                                            const EncodeColumns& columns, int rows, int half_k, int64_t words) {
  static_assert(GROUPS == 1 || GROUPS == 2, "GROUPS: 1 (plain rows) or 2 (gate/up interleave)");
  __shared__ uint32_t table[4][256];  // table[byte][v]: encoded word of v in fragment byte `byte`
  build_encode_tables(columns, table, threadIdx.x, kThreads);
  __syncthreads();
  const int64_t word = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (word >= words) return;
  const int chunks = half_k / 32, tiles = rows / 64;
  const int64_t record = word / kWordsPerRecord;
  const int within = static_cast<int>(word % kWordsPerRecord);
  const int i = within >> 2, j = within & 3;
  const int w = i >> 5, g = (i >> 2) & 7, q = i & 3;
  const int c = static_cast<int>(record % chunks);
  const int t = static_cast<int>((record / chunks) % tiles);
  const int64_t e = record / (static_cast<int64_t>(chunks) * tiles);
  const int64_t scale_row_bytes = half_k / 8;
  uint32_t encoded = 0;
  uint8_t scale_bytes[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int natural = GROUPS == 1 ? 64 * t + 16 * w + 8 * h + g : h * (rows / 2) + 32 * t + 8 * w + g;
    const int64_t row = e * rows + natural;
    const uint8_t scale = scales[row * scale_row_bytes + 4 * c + j];
    scale_bytes[h] = scale;
    const bool zero = (scale & 0x7F) == 0;
#pragma unroll
    for (int kh = 0; kh < 2; ++kh) {
      const uint8_t byte = zero ? 0 : codes[row * half_k + 32 * c + 8 * j + 4 * kh + q];
      encoded ^= table[2 * kh + h][byte];
    }
  }
  reinterpret_cast<uint32_t*>(out_codes)[word] = encoded;
  if (q == 0) {
    uint8_t* dst = out_scales + record * 256 + 64 * w + 8 * g + 2 * j;
    dst[0] = encode_scale(scale_bytes[0]);
    dst[1] = encode_scale(scale_bytes[1]);
  }
}

}  // namespace trace_kernels::moe_pack
