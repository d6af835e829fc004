// Unit test of building blocks in kernels/common/microkernels.h: DotRows (dot products reduced
// through PairSums' constant shuffles) and FewRowsGemmAcc must equal plain double sums, and the
// tile GEMM (GemmAccBody, every variant and register block) a scalar k-ascending sum bit for bit,
// at every instruction set's vector width. The widths are GCC vector types, so the
// AVX-512 forms (16 floats, 8 doubles) compile and run as generic vectors on any CPU: a machine
// without AVX-512 still checks their shuffle masks. TransposeRows8 and TransposeTiles must move
// every value to its place and write nothing else. Built and run by tests/test_cc_units.py.
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/common/microkernels.h"

using recops::Isa;

namespace {

int bad = 0;

void Expect(bool ok, const char* what, int lanes, int64_t a, int64_t b, int64_t c) {
  if (!ok && bad++ < 20)
    std::printf("%s, %d lanes: wrong at (%lld, %lld, %lld)\n", what, lanes,
                static_cast<long long>(a), static_cast<long long>(b), static_cast<long long>(c));
}

template <typename Acc, Isa I>
void CheckDotRows(std::mt19937_64& rng) {
  constexpr int W = recops::IsaVec<Acc, I>::kLanes;
  std::uniform_real_distribution<double> u(-1, 1);
  for (int64_t dim : {1, 3, 8, 16, 20, 64, 70}) {
    const int64_t lda = dim + 5;
    std::vector<Acc> a(W * lda), x(dim);
    for (Acc& v : a) v = static_cast<Acc>(u(rng));
    for (Acc& v : x) v = static_cast<Acc>(u(rng));
    // Rows in a shuffled order, and some repeated (as past a chunk's end).
    int64_t offset[W];
    for (int k = 0; k < W; ++k) offset[k] = ((k * 5 + 3) % W) * lda;
    if (W > 2) offset[W - 1] = offset[W - 2];
    Acc out[W];
    recops::DotRows<Acc, I>(a.data(), offset, x.data(), dim, out);
    for (int k = 0; k < W; ++k) {
      double exact = 0;
      for (int64_t d = 0; d < dim; ++d) exact += static_cast<double>(a[offset[k] + d]) * x[d];
      Expect(std::fabs(exact - out[k]) <= 1e-5 * (1 + std::fabs(exact)), "DotRows", W, dim, k, 0);
    }
  }
}

template <typename Acc, Isa I>
void CheckFewRows(std::mt19937_64& rng) {
  constexpr int W = recops::IsaVec<Acc, I>::kLanes;
  std::uniform_real_distribution<double> u(-1, 1);
  for (int64_t m = 1; m <= 5; ++m) {
    for (int64_t n : {1, 7, 20, 64, 70}) {
      for (int64_t k : {1, 8, 13}) {
        const int64_t lda = k + 3, ldb = n + 2, ldc = n + 1;
        std::vector<Acc> a(m * lda), b(k * ldb), c(m * ldc);
        for (Acc& v : a) v = static_cast<Acc>(u(rng));
        for (Acc& v : b) v = static_cast<Acc>(u(rng));
        for (Acc& v : c) v = static_cast<Acc>(u(rng));
        std::vector<Acc> before = c;
        recops::FewRowsGemmAcc<Acc, I>(m, n, k, a.data(), lda, b.data(), ldb, c.data(), ldc);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < ldc; ++j) {
            double exact = before[i * ldc + j];
            if (j < n) {
              for (int64_t e = 0; e < k; ++e)
                exact += static_cast<double>(a[i * lda + e]) * b[e * ldb + j];
            }
            // Columns past n (the row's padding) must stay untouched.
            Expect(std::fabs(exact - c[i * ldc + j]) <= 1e-5 * (1 + std::fabs(exact)),
                   "FewRowsGemmAcc", W, m, n, k);
          }
        }
      }
    }
  }
}

// GemmAccBody<Acc, I, kOverwrite, kTransA> against C[i][j] (+)= sum over k ascending of
// A(i, k) * B[k][j], one scalar multiply and add at a time: the same rounding (this file is
// compiled without FMA contraction), so equal bit for bit, on shapes reaching every block
// (R x 3 vectors on AVX2 where no lone vector is left, and on AVX-512 for an odd count of 3 or
// more, R x 2, one vector, the zero-padded last columns; the last M mod R rows 4, 2 and 1 at a
// time across 4, 2 and 1 vectors: 50 rows are dSᵀ's at d 50).
template <typename Acc, Isa I, bool kOverwrite, bool kTransA>
void CheckGemm(std::mt19937_64& rng) {
  constexpr int W = recops::IsaVec<Acc, I>::kLanes;
  std::uniform_real_distribution<double> u(-1, 1);
  for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 8, 13, 50, 64}) {
    for (int64_t n : {1, 7, 8, 9, 16, 23, 24, 25, 32, 40, 48, 50, 56, 64, 70, 80, 112}) {
      for (int64_t k : {1, 17, 64}) {
        const int64_t lda = (kTransA ? m : k) + 3, ldb = n + 2, ldc = n + 1;
        std::vector<Acc> a((kTransA ? k : m) * lda), b(k * ldb), c(m * ldc);
        for (Acc& v : a) v = static_cast<Acc>(u(rng));
        for (Acc& v : b) v = static_cast<Acc>(u(rng));
        for (Acc& v : c) v = static_cast<Acc>(u(rng));
        std::vector<Acc> want = c;
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            volatile Acc sum = kOverwrite ? Acc(0) : want[i * ldc + j];
            for (int64_t e = 0; e < k; ++e) {
              const Acc x = kTransA ? a[e * lda + i] : a[i * lda + e];
              const Acc product = x * b[e * ldb + j];
              sum = sum + product;
            }
            want[i * ldc + j] = sum;
          }
        }
        recops::GemmAccBody<Acc, I, kOverwrite, kTransA>(m, n, k, a.data(), lda, b.data(), ldb,
                                                         c.data(), ldc);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < ldc; ++j) {  // columns past n must stay untouched
            Expect(c[i * ldc + j] == want[i * ldc + j], "GemmAccBody", W, m, n, k);
          }
        }
      }
    }
  }
}

void CheckTransposeRows8(std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t dim : {8, 16, 64}) {
    const int64_t ld = dim * 3 + 8, ldd = 64 + 4;
    std::vector<float> src(8 * ld), dst(dim * ldd, 7.0f);
    for (float& v : src) v = u(rng);
    recops::TransposeRows8(src.data(), ld, dim, dst.data() + 2, ldd);
    for (int64_t d = 0; d < dim; ++d) {
      for (int64_t c = 0; c < ldd; ++c) {
        const bool inside = c >= 2 && c < 10;
        const float want = inside ? src[(c - 2) * ld + d] : 7.0f;  // nothing else written
        Expect(dst[d * ldd + c] == want, "TransposeRows8", 8, dim, d, c);
      }
    }
  }
}

// TransposeTiles: float bands of 8 rows in registers (cols a multiple of 8) and the rows past
// the last band element by element; every other shape and double element by element.
template <typename T>
void CheckTransposeTiles(std::mt19937_64& rng) {
  std::uniform_real_distribution<T> u(-1, 1);
  for (int64_t rows : {1, 7, 8, 13, 20, 24, 40}) {
    for (int64_t cols : {8, 16, 20, 40, 7}) {
      std::vector<T> src(rows * cols), dst(cols * rows + 5, T(7));
      for (T& v : src) v = u(rng);
      recops::TransposeTiles<T, T>(src.data(), rows, cols, dst.data());
      for (int64_t j = 0; j < cols; ++j) {
        for (int64_t i = 0; i < rows; ++i)
          Expect(dst[j * rows + i] == src[i * cols + j], "TransposeTiles", sizeof(T), rows, j, i);
      }
      for (int64_t e = cols * rows; e < cols * rows + 5; ++e)
        Expect(dst[e] == T(7), "TransposeTiles (past the end)", sizeof(T), rows, cols, e);
    }
  }
}

template <Isa I>
void CheckIsa(std::mt19937_64& rng) {
  CheckDotRows<float, I>(rng);
  CheckDotRows<double, I>(rng);
  CheckFewRows<float, I>(rng);
  CheckFewRows<double, I>(rng);
  CheckGemm<float, I, false, false>(rng);
  CheckGemm<float, I, false, true>(rng);
  CheckGemm<float, I, true, false>(rng);
  CheckGemm<float, I, true, true>(rng);
  CheckGemm<double, I, false, false>(rng);
  CheckGemm<double, I, true, true>(rng);
}

}  // namespace

int main() {
  std::mt19937_64 rng(11);
  CheckIsa<Isa::kBase>(rng);
  CheckIsa<Isa::kAvx2>(rng);
  CheckIsa<Isa::kAvx512>(rng);
  CheckTransposeRows8(rng);
  CheckTransposeTiles<float>(rng);
  CheckTransposeTiles<double>(rng);
  std::printf("%s\n", bad ? "FAILED" : "OK");
  return bad ? 1 : 0;
}
