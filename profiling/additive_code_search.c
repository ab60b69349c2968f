// Is there an additive K code layout? A search for code words whose four FP16 fields come out of one IMAD and one
// LOP3 each, (x * C_j + D_j) & 0x8E008E00, instead of kv_codes' two shifts and one LOP3 (no GPU, no project code).
//
//   gcc -O2 -mbmi2 -o /tmp/additive_code_search profiling/additive_code_search.c
//   /tmp/additive_code_search two-term       # every field's C = 2^a, 2^a + 2^b or 2^b - 2^a (a, b < 16), D = 0
//   /tmp/additive_code_search random N       # N random 16-bit C_0..C_3 and D_0..D_3 (and N with C_0 = 1, D = 0)
//
// A carry only moves up, so the low 16-bit lane's fields depend on the lane's own bits: a layout decodes every word
// only if each lane alone is a bijection of its 16 bits onto its 4 fields of 4 bits (sign at 15, e1 e0 m at 11..9).
// This tests that necessary condition on the low lane (only C and D mod 2^16 matter there) and prints what passes.
// kv_codes' XOR layout passes it (checked first, as a test of the test).
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const uint32_t kLaneMask = 0x8E00u;

// field j of x: 4 bits; the whole lane's 16 bits are the key
static int lane_bijective(const uint32_t c[4], const uint32_t d[4], int xor_layout) {
  static uint8_t seen[65536 / 8];
  memset(seen, 0, sizeof seen);
  for (uint32_t x = 0; x < 65536; ++x) {
    uint32_t key = 0;
    for (int j = 0; j < 4; ++j) {
      const uint32_t f = xor_layout ? ((x << c[j]) ^ (d[j] ? x << d[j] : 0u)) : x * c[j] + d[j];
      key |= _pext_u32(f, kLaneMask) << (4 * j);
    }
    if (seen[key >> 3] & (1u << (key & 7))) return 0;
    seen[key >> 3] |= 1u << (key & 7);
  }
  return 1;
}

static uint64_t rng_state = 88172645463325252ull;
static uint32_t rnd16(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (uint32_t)rng_state & 0xFFFFu;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s two-term | random N\n", argv[0]);
    return 2;
  }
  // kv_codes.cuh: f0 = x, f1 = x << 3, f2 = (x << 1) ^ (x << 6), f3 = (x << 2) ^ (x << 9)
  const uint32_t xs[4] = {0, 3, 1, 2}, xd[4] = {0, 0, 6, 9};
  printf("kv_codes' XOR layout: %s\n", lane_bijective(xs, xd, 1) ? "bijective" : "NOT bijective");
  long tried = 0, found = 0;
  const uint32_t zero[4] = {0, 0, 0, 0};
  if (strcmp(argv[1], "two-term") == 0) {
    uint32_t cs[256];
    int n = 0;
    for (int a = 0; a < 16; ++a) {
      cs[n++] = 1u << a;
      for (int b = a + 1; b < 16; ++b) cs[n++] = (1u << a) + (1u << b);
    }
    for (int a = 0; a < 16; ++a)
      for (int b = a + 1; b < 16; ++b) cs[n++] = (1u << b) - (1u << a);
    // fields are interchangeable, so each set of 4 distinct constants once (C_0 = 1 is f0 = x & mask, one LOP3)
    for (int h = 0; h < n; ++h)
      for (int i = h + 1; i < n; ++i)
        for (int j = i + 1; j < n; ++j)
          for (int k = j + 1; k < n; ++k) {
            const uint32_t c[4] = {cs[h], cs[i], cs[j], cs[k]};
            ++tried;
            if (lane_bijective(c, zero, 0) && found++ < 20) printf("%u %u %u %u\n", c[0], c[1], c[2], c[3]);
          }
  } else if (strcmp(argv[1], "random") == 0 && argc > 2) {
    const long n = atol(argv[2]);
    for (int fixed = 0; fixed < 2; ++fixed)
      for (long t = 0; t < n; ++t) {
        uint32_t c[4], d[4];
        for (int j = 0; j < 4; ++j) {
          c[j] = rnd16();
          d[j] = fixed ? 0u : rnd16();
        }
        if (fixed) c[0] = 1u;
        ++tried;
        if (lane_bijective(c, d, 0) && found++ < 20)
          printf("C %u %u %u %u D %u %u %u %u\n", c[0], c[1], c[2], c[3], d[0], d[1], d[2], d[3]);
      }
  } else {
    fprintf(stderr, "usage: %s two-term | random N\n", argv[0]);
    return 2;
  }
  printf("tried %ld, lane-bijective %ld\n", tried, found);
  return 0;
}
