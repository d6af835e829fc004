// Small dense building blocks for tiled kernels: a register-blocked GEMM-accumulate on
// row-major tiles and vectorisable sigmoid / SiLU. Everything is inline (always_inline) so
// that a caller compiled for several targets (function multiversioning) gets each target's
// instructions; GCC vector extensions lower to whatever the target has.
#ifndef RECOPS_KERNELS_COMMON_MICROKERNELS_H_
#define RECOPS_KERNELS_COMMON_MICROKERNELS_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/common/dtypes.h"

#define RECOPS_INLINE inline __attribute__((always_inline))

// Function multiversioning for hot non-template entry points: AVX-512, AVX2+FMA, baseline.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define RECOPS_MULTIVERSION \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define RECOPS_MULTIVERSION
#endif

namespace recops {

template <typename Acc>
struct Vec {
  typedef Acc type __attribute__((vector_size(64)));
  static constexpr int kLanes = 64 / sizeof(Acc);
};

template <typename V, typename Acc>
RECOPS_INLINE V LoadVec(const Acc* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}

template <typename V, typename Acc>
RECOPS_INLINE void StoreVec(Acc* p, const V& v) {
  std::memcpy(p, &v, sizeof(V));
}

// Loads one vector of Acc from B elements of type TB (bfloat16: widen the 16-bit halves).
template <typename V, typename Acc, typename TB>
RECOPS_INLINE V LoadVecAs(const TB* p) {
  if constexpr (std::is_same_v<TB, Acc>) {
    return LoadVec<V>(p);
  } else {
    static_assert(std::is_same_v<TB, Eigen::bfloat16> && std::is_same_v<Acc, float>,
                  "B operands are Acc or bfloat16 (float accumulation)");
    typedef uint16_t Narrow __attribute__((vector_size(32)));
    typedef uint32_t Wide __attribute__((vector_size(64)));
    Narrow n;
    std::memcpy(&n, p, sizeof(n));
    const Wide w = __builtin_convertvector(n, Wide) << 16;
    V v;
    std::memcpy(&v, &w, sizeof(v));
    return v;
  }
}

// C[M x N] += A[M x K] * B[K x N]; row-major with leading dimensions lda, ldb, ldc. The main
// block keeps R rows x 2 vectors of C in registers (R = 8 fits AVX-512's 32 registers, R = 4
// the 16 of AVX2). A may be of a narrower type TA (converted as it is broadcast), B may be
// bfloat16 with float accumulation (widened as it is loaded).
template <typename Acc, int R = 4, typename TA = Acc, typename TB = Acc>
RECOPS_INLINE void GemmAcc(int64_t M, int64_t N, int64_t K, const TA* A, int64_t lda,
                           const TB* B, int64_t ldb, Acc* C, int64_t ldc) {
  using V = typename Vec<Acc>::type;
  constexpr int64_t W = Vec<Acc>::kLanes;
  int64_t n0 = 0;
  for (; n0 + 2 * W <= N; n0 += 2 * W) {
    int64_t i = 0;
    for (; i + R <= M; i += R) {
      V c[R][2];
      for (int r = 0; r < R; ++r) {
        c[r][0] = LoadVec<V>(C + (i + r) * ldc + n0);
        c[r][1] = LoadVec<V>(C + (i + r) * ldc + n0 + W);
      }
      for (int64_t k = 0; k < K; ++k) {
        const V b0 = LoadVecAs<V, Acc, TB>(B + k * ldb + n0), b1 = LoadVecAs<V, Acc, TB>(B + k * ldb + n0 + W);
        for (int r = 0; r < R; ++r) {
          const Acc a = ToAcc<TA, Acc>(A[(i + r) * lda + k]);
          c[r][0] += a * b0;
          c[r][1] += a * b1;
        }
      }
      for (int r = 0; r < R; ++r) {
        StoreVec(C + (i + r) * ldc + n0, c[r][0]);
        StoreVec(C + (i + r) * ldc + n0 + W, c[r][1]);
      }
    }
    for (; i < M; ++i) {
      V c0 = LoadVec<V>(C + i * ldc + n0), c1 = LoadVec<V>(C + i * ldc + n0 + W);
      for (int64_t k = 0; k < K; ++k) {
        const Acc a = ToAcc<TA, Acc>(A[i * lda + k]);
        c0 += a * LoadVecAs<V, Acc, TB>(B + k * ldb + n0);
        c1 += a * LoadVecAs<V, Acc, TB>(B + k * ldb + n0 + W);
      }
      StoreVec(C + i * ldc + n0, c0);
      StoreVec(C + i * ldc + n0 + W, c1);
    }
  }
  for (; n0 + W <= N; n0 += W) {
    int64_t i = 0;
    for (; i + 4 <= M; i += 4) {
      V c[4];
      for (int r = 0; r < 4; ++r) c[r] = LoadVec<V>(C + (i + r) * ldc + n0);
      for (int64_t k = 0; k < K; ++k) {
        const V b = LoadVecAs<V, Acc, TB>(B + k * ldb + n0);
        for (int r = 0; r < 4; ++r) c[r] += ToAcc<TA, Acc>(A[(i + r) * lda + k]) * b;
      }
      for (int r = 0; r < 4; ++r) StoreVec(C + (i + r) * ldc + n0, c[r]);
    }
    for (; i < M; ++i) {
      V c = LoadVec<V>(C + i * ldc + n0);
      for (int64_t k = 0; k < K; ++k) c += ToAcc<TA, Acc>(A[i * lda + k]) * LoadVecAs<V, Acc, TB>(B + k * ldb + n0);
      StoreVec(C + i * ldc + n0, c);
    }
  }
  if (n0 < N) {
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t k = 0; k < K; ++k) {
        const Acc a = ToAcc<TA, Acc>(A[i * lda + k]);
        for (int64_t n = n0; n < N; ++n) C[i * ldc + n] += a * ToAcc<TB, Acc>(B[k * ldb + n]);
      }
    }
  }
}

// exp for float without library calls (vectorisable): Cephes-style range reduction and
// polynomial, about 1 ulp on [-87, 88]; inputs are clamped to that range.
RECOPS_INLINE float ExpF(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + magic) - magic;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

RECOPS_INLINE float Sigmoid(float x) { return 1.0f / (1.0f + ExpF(-x)); }
RECOPS_INLINE double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace recops

#endif  // RECOPS_KERNELS_COMMON_MICROKERNELS_H_
