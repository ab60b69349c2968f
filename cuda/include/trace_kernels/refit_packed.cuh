// RL weight sync in one op: expert weights w [E, N, K] -> the MoE GEMM's packed, encoded NVFP4
// (moe_layout.MoEWeights) written in place, bit for bit refit_weights (v2) followed by the torch path
// of moe_layout.store_fragments_. Replaces refit_weights (natural layout into staging buffers) +
// moe_pack (a second pass that gathers single bytes): the codes never exist in the natural layout.
//
// Two launches (ops/refit_packed.py). First refit v2's amax pass, unchanged (refit_weights.cuh
// refit_amax_v2: one atomic max per CTA into workspace[2 e]). Then this quantize pass over packed
// records: one (expert e, 64-row tile t, 64-K chunk c) record = 64 x 64 elements in, 2048 code
// bytes + 256 scale bytes out, both contiguous in the destination.
//
// Work split, per warp, records strided over a persistent grid (experts in reverse, so the first
// reads hit what the amax pass left in L2):
// - load: the record's 64 rows x 64 elements arrive by 16-byte cp.async (L2 only), 4 whole 128-byte
//   row segments (FP32: 2 of 256 bytes) per warp instruction, into a per-warp ring of STAGES buffers; the
//   16-byte chunk ch of tile row r sits at ch ^ (r & 7) (XOR swizzle: the reads below are
//   conflict-free, no padding). STAGES - 1 records are in flight per warp while one is computed.
// - quantize: lane L = 8 w + g owns tile rows r(h) = 16 w + 8 h + g (h = 0, 1), i.e. wgmma fragment
//   threads i = 32 w + 4 g + q, q = 0..3, of the record: exactly the 64 contiguous output bytes
//   [64 L, 64 L + 64) and the 8 scale bytes [8 L, 8 L + 8). Per k16 step j it quantizes the two
//   blocks (r(0), j), (r(1), j) with the exact code refit v2 runs (quantize_epilogue.cuh:
//   block16_abs_max, block_step[_fast], quantize_block16[_fast], same expert scale s), so codes and
//   E4M3 scales are refit_weights' bits; a zero-scale block's codes are +0 by construction (d = 0,
//   or the fast path's d = 2^100), which is what store_fragments_ stores for them.
// - assemble + encode: fragment word (q, j) has byte 2 kh + h = byte q of block (r(h), j)'s codes of
//   elements 8 kh .. 8 kh + 7, i.e. (.x, .y)[kh] >> 8 q. The encoding (moe_encoding.py) is GF(2)
//   linear, so the encoded word is the XOR of four 256-entry byte tables in shared memory (built
//   from moe_encoding.encode_columns(), as moe_pack does) indexed straight by those code bytes: no
//   fragment word is formed. An in-register form needs 15 rotate + mask terms per word (~29
//   instructions against ~13 for the tables, SASS).
// - store: the 16 encoded words as four 16-byte stores (a warp covers the record's 2048 bytes), the
//   scales re-encoded (moe_pack::encode_scale) as one 8-byte store.
// GROUPS = 2: w's rows are [gate; up] halves; tile row 64 t + 16 w + 8 h + g is natural row
// h * N/2 + 32 t + 8 w + g (moe_layout.interleave_gate_up), applied when the rows are loaded.
// Non-finite input: an expert whose amax is NaN/Inf gets nothing written (codes, scales and scale
// keep their previous bytes) and its bad elements are reported to the status word (refit's bit,
// rows e * N + natural row), as refit_weights does.
#pragma once

#include <stdint.h>

#include "trace_kernels/moe_pack.cuh"
#include "trace_kernels/nvfp4.cuh"
#include "trace_kernels/quantize_epilogue.cuh"
#include "trace_kernels/refit_weights.cuh"
#include "trace_kernels/status.cuh"
#include "trace_kernels/vec.cuh"

namespace trace_kernels::refit_packed {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kTileRows = 64;      // moe_layout.TILE_ROWS
constexpr int kChunkK = 64;        // moe_layout.CHUNK_K
constexpr int kCodeRecord = 2048;  // code bytes per record
constexpr int kScaleRecord = 256;  // scale bytes per record

template <typename T_, int GROUPS_, int STAGES_>
struct Config {
  using T = T_;
  static constexpr int GROUPS = GROUPS_;
  static constexpr int STAGES = STAGES_;
  static_assert(GROUPS == 1 || GROUPS == 2, "GROUPS: 1 (plain rows) or 2 (gate/up interleave)");
  static_assert(STAGES >= 2, "at least one record in flight while one is computed");
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "bf16 / fp16 / fp32 input");
  static constexpr int kRowBytes = kChunkK * static_cast<int>(sizeof(T));  // 128 | 256
  static constexpr int kRowChunks = kRowBytes / 16;                      // 16-byte chunks per row: 8 | 16
  static constexpr int kRecordBytes = kTileRows * kRowBytes;             // 8 KB | 16 KB
  static constexpr int kCopiesPerLane = kTileRows * kRowChunks / 32;     // cp.async per lane per record
  static constexpr int kSmemBytes = kWarps * STAGES * kRecordBytes;      // dynamic shared memory
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// Byte offset of 16-byte chunk ch of tile row r in a stage buffer (XOR swizzle over 8 chunks).
template <class Cfg>
__device__ __forceinline__ int chunk_offset(int r, int ch) {
  return r * Cfg::kRowBytes + 16 * (ch ^ (r & 7));
}

// Natural row (inside the expert) of tile row r of tile t.
template <int GROUPS>
__device__ __forceinline__ int natural_row(int r, int t, int n) {
  if constexpr (GROUPS == 1) return kTileRows * t + r;
  else return ((r >> 3) & 1) * (n / 2) + 32 * t + 8 * (r >> 4) + (r & 7);
}

struct Record {
  int e, t, c;
};

// records < 2^30 (checked by the host): 32-bit divisions, one per record loaded
__device__ __forceinline__ Record record_at(int rec, int tiles, int chunks) {
  const int per_expert = tiles * chunks;
  const int rem = rec % per_expert;
  return Record{rec / per_expert, rem / chunks, rem % chunks};
}

// The warp's cp.asyncs of one record into a stage buffer: per instruction 32 lanes x 16 bytes =
// 4 whole row segments (FP32: 2). Lane l copies chunk ch = l % kRowChunks of tile rows
// r_l + kRpi i (r_l = l / kRowChunks < kRpi, i = 0 .. kCopiesPerLane - 1); since kRpi i is a multiple
// of kRpi and r_l < kRpi, natural_row(r_l + kRpi i) = natural_row(r_l) + natural_row(kRpi i) - natural_row(0)
// with the second part a compile-time number of rows (plus N/2 rows for the up half): one base
// address per record and constant offsets, no per-copy index arithmetic. src: the lane's chunk of
// tile row r_l; half_bytes: N/2 rows (GROUPS = 2).
template <class Cfg>
__device__ __forceinline__ void load_record(const char* src, int64_t row_bytes, int64_t half_bytes, uint32_t stage,
                                            int lane) {
  constexpr int kRpi = 32 / Cfg::kRowChunks;  // rows per cp.async instruction
  const int r_lane = lane / Cfg::kRowChunks, x0 = (lane % Cfg::kRowChunks) ^ r_lane;
  const uint32_t dst = stage + r_lane * Cfg::kRowBytes;
#pragma unroll
  for (int i = 0; i < Cfg::kCopiesPerLane; ++i) {
    const int r = kRpi * i;  // tile row - r_lane; (r_lane + r) & 7 == r_lane | (r & 7): disjoint bits
    const int64_t rows = Cfg::GROUPS == 1 ? r : 8 * (r >> 4) + (r & 7);
    const int64_t offset = rows * row_bytes + (Cfg::GROUPS == 2 && ((r >> 3) & 1) ? half_bytes : 0);
    cp_async16(dst + r * Cfg::kRowBytes + 16 * (x0 ^ (r & 7)), src + offset);
  }
}

// The lane's source address in record rc (its chunk of tile row lane / kRowChunks).
template <class Cfg>
__device__ __forceinline__ const char* record_src(const typename Cfg::T* __restrict__ w, const Record& rc, int n,
                                                  int64_t row_bytes, int lane) {
  const int64_t row = static_cast<int64_t>(rc.e) * n + natural_row<Cfg::GROUPS>(lane / Cfg::kRowChunks, rc.t, n);
  return reinterpret_cast<const char*>(w) + row * row_bytes +
         (kChunkK * rc.c * static_cast<int>(sizeof(typename Cfg::T)) + 16 * (lane % Cfg::kRowChunks));
}

// Half block hb (elements 8 hb .. 8 hb + 7 of the chunk) of tile row r from a stage buffer.
template <class Cfg>
__device__ __forceinline__ Vec8<typename Cfg::T> load_half_block(const uint8_t* stage, int r, int hb) {
  Vec8<typename Cfg::T> v;
  if constexpr (sizeof(typename Cfg::T) == 2) {
    v.raw = *reinterpret_cast<const uint4*>(stage + chunk_offset<Cfg>(r, hb));
  } else {
    v.lo = *reinterpret_cast<const float4*>(stage + chunk_offset<Cfg>(r, 2 * hb));
    v.hi = *reinterpret_cast<const float4*>(stage + chunk_offset<Cfg>(r, 2 * hb + 1));
  }
  return v;
}

// Non-finite expert: report this lane's bad elements (its two rows), write nothing.
template <class Cfg>
__device__ __forceinline__ void report_record(const uint8_t* stage, const Record& rc, int n, int lane,
                                              uint32_t* status) {
  for (int h = 0; h < 2; ++h) {
    const int r = 16 * (lane >> 3) + 8 * h + (lane & 7);
    const uint64_t row = static_cast<uint64_t>(rc.e) * n + natural_row<Cfg::GROUPS>(r, rc.t, n);
    for (int hb = 0; hb < kChunkK / 8; ++hb) {
      const Vec8<typename Cfg::T> v = load_half_block<Cfg>(stage, r, hb);
      if (nvfp4::is_finite(v.abs_max())) continue;
      float f[8];
      v.to_float(f);
      report_nonfinite(status, kStatusRefitWeights, row, static_cast<uint32_t>(kChunkK * rc.c + 8 * hb), f);
    }
  }
}

// One record from a stage buffer -> its packed, encoded codes and scales (lane L's 64 + 8 bytes). known: the amax of
// block (r0 + 8 h, j) of the lane's rows at [h][j] when the caller took them already (else nullptr: taken here).
template <class Cfg, bool kFast>
__device__ __forceinline__ void pack_record(const uint8_t* stage, const uint32_t (*table)[256], uint8_t* __restrict__ codes,
                                            uint8_t* __restrict__ block_scales, int64_t rec, const RefitExpertScale& x,
                                            int lane, const float (*known)[4] = nullptr) {
  using T = typename Cfg::T;
  const int r0 = 16 * (lane >> 3) + (lane & 7);  // rows r0 (h = 0) and r0 + 8 (h = 1)
  uint32_t enc[4][4];                            // [q][j]: encoded fragment words
  uint32_t scale_words[2] = {0u, 0u};            // scale byte 2 j + h
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint2 code[2];  // [h]: .x elements 16 j .. +7, .y 16 j + 8 .. +15 (nibble per element)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const Vec8<T> lo = load_half_block<Cfg>(stage, r0 + 8 * h, 2 * j);
      const Vec8<T> hi = load_half_block<Cfg>(stage, r0 + 8 * h, 2 * j + 1);
      const float block_amax = known != nullptr ? known[h][j] : block16_abs_max<T>(lo, hi);
      uint4 unused_lo, unused_hi;
      nvfp4::BlockStep step;
      if constexpr (kFast) {
        step = block_step_fast(block_amax, x.s, x.six_s_div);
        code[h] = quantize_block16_fast<T, false>(lo, hi, step, unused_lo, unused_hi);
      } else {
        step = nvfp4::block_step(block_amax, x.s, x.six_s);
        code[h] = quantize_block16<T>(lo, hi, step, false, unused_lo, unused_hi);
      }
      scale_words[j >> 1] |= static_cast<uint32_t>(moe_pack::encode_scale(step.scale_bits)) << (8 * (2 * (j & 1) + h));
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      enc[q][j] = table[0][(code[0].x >> (8 * q)) & 0xFFu] ^ table[1][(code[1].x >> (8 * q)) & 0xFFu] ^
                  table[2][(code[0].y >> (8 * q)) & 0xFFu] ^ table[3][(code[1].y >> (8 * q)) & 0xFFu];
    }
  }
  uint4* out = reinterpret_cast<uint4*>(codes + rec * kCodeRecord + 64 * lane);  // fragment threads 4 L .. 4 L + 3
#pragma unroll
  for (int q = 0; q < 4; ++q) out[q] = make_uint4(enc[q][0], enc[q][1], enc[q][2], enc[q][3]);
  *reinterpret_cast<uint2*>(block_scales + rec * kScaleRecord + 8 * lane) = make_uint2(scale_words[0], scale_words[1]);
}

// The persistent record loop of every pass over records: warp-strided, in reverse (the grid's i-th is record
// records - 1 - i: the amax pass ends on the last experts, which may still be in L2), each record loaded by cp.async
// STAGES - 1 records ahead into the warp's ring. next(i): the first index >= i in i's residue mod the grid's warps
// that the loop visits (the identity, or one that skips experts). after_prefill() runs once the first loads are
// issued (the encoding tables are built meanwhile); body(stage, record, natural record index) once per record.
template <class Cfg, class Next, class AfterPrefill, class Body>
__device__ __forceinline__ void for_each_record(const typename Cfg::T* __restrict__ w, uint8_t* ring, int n, int k,
                                                int records, Next next, AfterPrefill after_prefill, Body body) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tiles = n / kTileRows, chunks = k / kChunkK;
  const int64_t row_bytes = static_cast<int64_t>(k) * sizeof(typename Cfg::T);
  const int64_t half_bytes = static_cast<int64_t>(n / 2) * row_bytes;
  const int stride = gridDim.x * kWarps;
  const uint32_t ring_addr = smem_addr(ring);

  // queue: the records loaded and not yet computed, in order; load_at: the next index to load (< 2^31: records +
  // STAGES * grid warps)
  Record queue[Cfg::STAGES - 1];
  const int start = next(blockIdx.x * kWarps + warp);
  int load_at = start;
#pragma unroll
  for (int s = 0; s < Cfg::STAGES - 1; ++s) {
    if (load_at < records) {
      queue[s] = record_at(records - 1 - load_at, tiles, chunks);
      load_record<Cfg>(record_src<Cfg>(w, queue[s], n, row_bytes, lane), row_bytes, half_bytes,
                       ring_addr + s * Cfg::kRecordBytes, lane);
      load_at = next(load_at + stride);
    }
    cp_async_commit();
  }
  after_prefill();

  int slot = 0;  // stage of record i
  for (int i = start; i < records; i = next(i + stride)) {
    const Record rc = queue[0];
#pragma unroll
    for (int s = 0; s + 1 < Cfg::STAGES - 1; ++s) queue[s] = queue[s + 1];
    {  // refill the stage freed by the previous record with the record STAGES - 1 visits ahead
      __syncwarp();  // every lane has finished reading it
      const int next_slot = slot == 0 ? Cfg::STAGES - 1 : slot - 1;
      if (load_at < records) {
        queue[Cfg::STAGES - 2] = record_at(records - 1 - load_at, tiles, chunks);
        load_record<Cfg>(record_src<Cfg>(w, queue[Cfg::STAGES - 2], n, row_bytes, lane), row_bytes, half_bytes,
                         ring_addr + next_slot * Cfg::kRecordBytes, lane);
        load_at = next(load_at + stride);
      }
      cp_async_commit();
    }
    cp_async_wait<Cfg::STAGES - 1>();  // this lane's copies of record i have landed
    __syncwarp();                      // and every other lane's
    body(ring + slot * Cfg::kRecordBytes, rc, static_cast<int64_t>(records - 1 - i));
    slot = slot + 1 == Cfg::STAGES ? 0 : slot + 1;
  }
  cp_async_wait<0>();  // nothing left in flight at exit (the last refills are empty groups)
}

// One record with expert scale x: its packed codes and scales, or, for a non-finite expert, a report of its bad
// elements (nothing written).
template <class Cfg>
__device__ __forceinline__ void pack_or_report(const uint8_t* stage, const uint32_t (*table)[256],
                                               uint8_t* __restrict__ codes, uint8_t* __restrict__ block_scales,
                                               int64_t rec, const Record& rc, const RefitExpertScale& x, int n,
                                               int lane, uint32_t* __restrict__ status) {
  if (!x.finite) report_record<Cfg>(stage, rc, n, lane, status);
  else if (x.fast) pack_record<Cfg, true>(stage, table, codes, block_scales, rec, x, lane);
  else pack_record<Cfg, false>(stage, table, codes, block_scales, rec, x, lane);
}

// The quantize pass. grid: persistent (<= one wave), kThreads threads, Cfg::kSmemBytes dynamic shared
// memory. workspace[2 e]: expert e's |w| amax bits from refit_amax_v2. records = E * N/64 * K/64 < 2^30.
template <class Cfg>
__device__ __forceinline__ void quantize_pack(const typename Cfg::T* __restrict__ w, uint8_t* __restrict__ codes,
                                              uint8_t* __restrict__ block_scales, float* __restrict__ scales,
                                              const uint32_t* __restrict__ workspace, const moe_pack::EncodeColumns& columns,
                                              int n, int k, int records, uint32_t* __restrict__ status) {
  extern __shared__ __align__(128) uint8_t stages[];  // [kWarps][STAGES][kRecordBytes]
  __shared__ uint32_t table[4][256];                  // table[byte][v]: encoded word of v in fragment byte `byte`
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int expert = -1;
  RefitExpertScale x{};
  for_each_record<Cfg>(
      w, stages + warp * Cfg::STAGES * Cfg::kRecordBytes, n, k, records, [](int i) { return i; },
      [&] {
        moe_pack::build_encode_tables(columns, table, threadIdx.x, kThreads);  // while the first records load
        __syncthreads();
      },
      [&](const uint8_t* stage, const Record& rc, int64_t rec) {
        if (rc.e != expert) {  // warp-uniform
          expert = rc.e;
          x = refit_expert_scale(__uint_as_float(__ldcg(workspace + 2 * rc.e)));
        }
        if (x.finite && rc.t == 0 && rc.c == 0 && lane == 0) scales[rc.e] = x.s;
        pack_or_report<Cfg>(stage, table, codes, block_scales, rec, rc, x, n, lane, status);
      });
}

}  // namespace trace_kernels::refit_packed
