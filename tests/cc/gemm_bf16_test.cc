// Unit test of GemmBf16 (kernels/common/gemm_bf16.cc, AVX512-BF16 dot products): on operands
// that are bfloat16 numbers, every element of C must be the exact sum of the exact products
// (computed in double) up to float rounding of a K-term sum, columns and rows outside C's
// block untouched, for plain and transposed A, overwrite and accumulate, shapes reaching every
// register block and tail (odd K, N not a multiple of 16, M not a multiple of 8); operands
// from registered buffers as from per-call packs (CheckRegistered; the tiles released between
// its rounds, as at a work item's end). All of it three ways: in vectors alone; with the whole
// 16 x 16 blocks on emulated AMX tiles (EmulatedTiles: the tile code checked on any CPU with
// AVX512-BF16; a fault of the emulation aborts); and, where the CPU has AMX-BF16 and the OS
// grants its state, on the CPU's tiles. Exits 77 (a skip, tests/test_cc_units.py) on a CPU
// without AVX512-BF16.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/common/gemm_bf16.cc"

namespace {

int bad = 0;

// A random bfloat16 number in [-1, 1] as a float (its low 16 bits zero).
float Bf16Value(std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-1, 1);
  float x = u(rng);
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits &= 0xffff0000u;
  std::memcpy(&x, &bits, 4);
  return x;
}

// Shapes reaching the tiles' 32 x 32 and 16-row or -column edge blocks and their tails too:
// M and N of 16, 17, 32, 48; K of 32 (16 pairs), 40 (4 pairs after the tiles), 65 (odd).
template <class Tiles, bool kOverwrite, bool kTransA>
void CheckGemm(std::mt19937_64& rng, const char* how) {
  for (int64_t m : {1, 3, 5, 8, 13, 16, 17, 32, 48, 64}) {
    for (int64_t n : {1, 7, 16, 17, 32, 40, 50, 64, 70}) {
      for (int64_t k : {1, 2, 17, 32, 40, 64, 65}) {
        const int64_t lda = (kTransA ? m : k) + 3, ldb = n + 2, ldc = n + 1;
        std::vector<float> a((kTransA ? k : m) * lda), b(k * ldb), c((m + 1) * ldc);
        for (float& v : a) v = Bf16Value(rng);
        for (float& v : b) v = Bf16Value(rng);
        for (float& v : c) v = Bf16Value(rng);
        const std::vector<float> before = c;
        recops::GemmBf16With<Tiles, kOverwrite, kTransA>(m, n, k, a.data(), lda, b.data(), ldb,
                                                         c.data(), ldc);
        for (int64_t i = 0; i <= m; ++i) {
          for (int64_t j = 0; j < ldc; ++j) {
            const float got = c[i * ldc + j];
            if (i == m || j >= n) {  // outside the block: untouched
              if (got != before[i * ldc + j] && bad++ < 20)
                std::printf("%s: wrote outside C at (%lld, %lld), shape %lld %lld %lld\n", how,
                            (long long)i, (long long)j, (long long)m, (long long)n, (long long)k);
              continue;
            }
            double exact = kOverwrite ? 0.0 : before[i * ldc + j], magnitude = std::fabs(exact);
            for (int64_t e = 0; e < k; ++e) {
              const double x = kTransA ? a[e * lda + i] : a[i * lda + e];
              exact += x * b[e * ldb + j];
              magnitude += std::fabs(x * b[e * ldb + j]);
            }
            const double bound = (k + 2) * std::ldexp(magnitude, -24) + 1e-30;
            if (!(std::fabs(got - exact) <= bound) && bad++ < 20)
              std::printf("%s: GemmBf16<%d, %d> (%lld, %lld) of %lld x %lld x %lld: %.9g vs %.9g\n",
                          how, kOverwrite, kTransA, (long long)i, (long long)j, (long long)m,
                          (long long)n, (long long)k, got, exact);
          }
        }
      }
    }
  }
}

// Operands read from registered buffers (Bf16RegisterOperand, converted once) must give the
// same bits as the same GEMM packing them per call, for A rows and B pair rows at even and odd
// offsets and an odd K (both not taken from the registry), and follow a buffer registered
// anew after it changed; after Bf16ClearOperands, nothing is read from the old copies.
template <class Tiles>
void CheckRegistered(std::mt19937_64& rng, const char* how) {
  const int64_t ld = 64, rows = 128;
  std::vector<float> abuf(rows * ld), bbuf(rows * ld), c(64 * 80), want(64 * 80);
  for (int round = 0; round < 10; ++round) {  // more than the 8 slots kept: each reused
    // As at a work item's end: the tiles released (the emulation then faults on a tile
    // instruction before the next configuration).
    recops::Bf16ReleaseTiles();
    for (float& v : abuf) v = Bf16Value(rng);
    for (float& v : bbuf) v = Bf16Value(rng);
    if (round < 9) {
      recops::Bf16RegisterOperand(abuf.data(), rows, ld);
      recops::Bf16RegisterOperand(bbuf.data(), rows, ld);
    } else {
      recops::Bf16ClearOperands();
    }
    for (int64_t a_row : {0, 8, 64}) {
      for (int64_t b_row : {0, 6, 7, 64}) {
        for (int64_t k : {64, 33, 2}) {
          for (int64_t n : {64, 50}) {
            const float* a = abuf.data() + a_row * ld;
            const float* b = bbuf.data() + b_row * ld;
            std::vector<float> ac(a, a + 64 * ld), bc(b, b + k * ld);  // unregistered copies
            recops::GemmBf16With<Tiles, true, false>(64, n, k, ac.data(), ld, bc.data(), ld,
                                                     want.data(), 80);
            recops::GemmBf16With<Tiles, true, false>(64, n, k, a, ld, b, ld, c.data(), 80);
            for (int64_t e = 0; e < 64 * 80; ++e) {
              if (e % 80 < n && c[e] != want[e] && bad++ < 20)
                std::printf(
                    "%s: registered operands, round %d, rows %lld / %lld, k %lld: %g vs %g\n", how,
                    round, (long long)a_row, (long long)b_row, (long long)k, c[e], want[e]);
            }
          }
        }
      }
    }
  }
}

template <class Tiles>
void Check(std::mt19937_64& rng, const char* how) {
  CheckGemm<Tiles, false, false>(rng, how);
  CheckGemm<Tiles, false, true>(rng, how);
  CheckGemm<Tiles, true, false>(rng, how);
  CheckGemm<Tiles, true, true>(rng, how);
  CheckRegistered<Tiles>(rng, how);
}

}  // namespace

int main() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512bf16") || !__builtin_cpu_supports("avx512bw")) {
    std::printf("this CPU lacks avx512_bf16: GemmBf16 not run\n");
    return 77;
  }
  std::mt19937_64 rng(7);
  Check<recops::NoTiles>(rng, "vectors");
  Check<recops::EmulatedTiles>(rng, "emulated AMX tiles");
  if (recops::CpuHasAmxBf16() && recops::RequestAmxState()) {
    Check<recops::AmxTiles>(rng, "AMX tiles");
  } else {
    std::printf("no AMX-BF16 tiles here (CPU or OS): run on emulated tiles only\n");
  }
  std::printf("%s\n", bad ? "FAILED" : "OK");
  return bad ? 1 : 0;
}
