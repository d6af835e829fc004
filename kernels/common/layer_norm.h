// LayerNorm row math shared by ln_mul, norm_multiply_dropout and token_mixing: moments with
// vector accumulators, the normalised row, the backward through the normalisation, the
// counter-based dropout mask, and deterministic column sums of the affine parameters'
// gradients. Rows are converted to the accumulator type Acc once (float for float16 /
// bfloat16 / float32, double for float64) and every pass then runs over that L1-resident row.
#ifndef RECOPS_KERNELS_COMMON_LAYER_NORM_H_
#define RECOPS_KERNELS_COMMON_LAYER_NORM_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/common/dtypes.h"
#include "kernels/common/microkernels.h"

namespace recops {

// x as Acc: x itself when T is Acc, else converted into buf (n values).
template <typename T, typename Acc>
RECOPS_INLINE const Acc* RowAsAcc(const T* x, int64_t n, Acc* buf) {
  if constexpr (std::is_same_v<T, Acc>) {
    return x;
  } else {
    for (int64_t c = 0; c < n; ++c) buf[c] = ToAcc<T, Acc>(x[c]);
    return buf;
  }
}

// Sum of a[c] * (b ? b[c] : 1) over c < n, in four vector accumulators (GCC does not
// reassociate a scalar float sum into vectors by itself). The order depends only on n, not on
// the instruction set: each accumulator is 64 bytes of lanes (one AVX-512 register), held as
// 64 / kVecBytes<I> native vectors elsewhere (a 64-byte GCC vector without AVX-512 lives in
// memory: the AVX2 build of this loop ran ~4x slower, about half of ln_mul's kernel time).
template <typename Acc, Isa I>
RECOPS_INLINE Acc RowDot(const Acc* a, const Acc* b, int64_t n) {
  using V = typename IsaVec<Acc, I>::type;
  constexpr int64_t VL = IsaVec<Acc, I>::kLanes;  // lanes of a native vector
  constexpr int64_t W = Vec<Acc>::kLanes;         // lanes of a 64-byte accumulator
  constexpr int P = W / VL;
  V s[4][P];
  for (int j = 0; j < 4; ++j) {
    for (int q = 0; q < P; ++q) s[j][q] = V{};
  }
  int64_t c = 0;
  for (; c + 4 * W <= n; c += 4 * W) {
    if (b != nullptr) {
      for (int j = 0; j < 4; ++j) {
        for (int q = 0; q < P; ++q) {
          const int64_t o = c + j * W + q * VL;
          s[j][q] += LoadVec<V>(a + o) * LoadVec<V>(b + o);
        }
      }
    } else {
      for (int j = 0; j < 4; ++j) {
        for (int q = 0; q < P; ++q) s[j][q] += LoadVec<V>(a + c + j * W + q * VL);
      }
    }
  }
  Acc sum = Acc(0);
  for (int q = 0; q < P; ++q) {
    const V t = (s[0][q] + s[1][q]) + (s[2][q] + s[3][q]);
    for (int l = 0; l < VL; ++l) sum += t[l];
  }
  for (; c < n; ++c) sum += b != nullptr ? a[c] * b[c] : a[c];
  return sum;
}

template <typename Acc>
struct RowMoments {
  Acc mean, var, rstd;
};

// Mean and biased variance (two passes: no cancellation) and 1 / sqrt(var + epsilon). xc:
// scratch for n centred values.
template <typename Acc, Isa I>
RECOPS_INLINE RowMoments<Acc> Moments(const Acc* __restrict x, int64_t n, Acc epsilon,
                                      Acc* __restrict xc) {
  RowMoments<Acc> m;
  m.mean = RowDot<Acc, I>(x, nullptr, n) / static_cast<Acc>(n);
  for (int64_t c = 0; c < n; ++c) xc[c] = x[c] - m.mean;
  m.var = RowDot<Acc, I>(xc, xc, n) / static_cast<Acc>(n);
  m.rstd = Acc(1) / std::sqrt(m.var + epsilon);
  return m;
}

// xhat = (x - mean) * rstd.
template <typename Acc>
RECOPS_INLINE void Normalize(const Acc* __restrict x, const RowMoments<Acc>& m, int64_t n,
                             Acc* __restrict xhat) {
  const Acc mean = m.mean, rstd = m.rstd;
  for (int64_t c = 0; c < n; ++c) xhat[c] = (x[c] - mean) * rstd;
}

// The backward through y = xhat * gamma + beta given d_ln = dL/dy: dgamma += d_ln * xhat,
// dbeta += d_ln (this row's contributions, into the caller's partial sums), and
// dx = rstd * (t - mean(t) - xhat * mean(t * xhat)) with t = d_ln * gamma (t: scratch). The
// pointers are restrict (GCC vectorises these loops only then).
template <typename Acc, Isa I>
RECOPS_INLINE void LayerNormBackwardRow(const Acc* __restrict xhat, const Acc* __restrict d_ln,
                                        const Acc* __restrict gamma, Acc rstd, int64_t n,
                                        Acc* __restrict t, Acc* __restrict dgamma,
                                        Acc* __restrict dbeta, Acc* __restrict dx) {
  for (int64_t c = 0; c < n; ++c) {
    dgamma[c] += d_ln[c] * xhat[c];
    dbeta[c] += d_ln[c];
    t[c] = d_ln[c] * gamma[c];
  }
  const Acc inv_n = Acc(1) / static_cast<Acc>(n);
  const Acc mean_t = RowDot<Acc, I>(t, nullptr, n) * inv_n;
  const Acc mean_tx = RowDot<Acc, I>(t, xhat, n) * inv_n;
  for (int64_t c = 0; c < n; ++c) dx[c] = rstd * (t[c] - mean_t - xhat[c] * mean_tx);
}

// Inverted dropout without a stored mask: element (row, c) of a call with seed (s0, s1) is
// kept iff a 32-bit hash of it is >= threshold = round(rate * 2^32) (probability 1 - rate);
// kept values are scaled by 1 / (1 - rate). The same (seed, row, c) gives the same decision in
// the forward and the backward and on any thread count. Per row, a 64-bit key (splitmix64's
// finaliser of the seed's key plus row times the golden ratio); per element, the 32-bit
// "lowbias32" integer hash of that key xor c: 32-bit multiplies vectorise two to three times
// cheaper than 64-bit ones (measured: the 64-bit version held dropout at ~59% of the copy
// ceiling, this one reaches the no-dropout rate within a few %).
class DropoutMask {
 public:
  DropoutMask(double rate, int64_t seed0, int64_t seed1)
      : active_(rate > 0.0),
        threshold_(static_cast<uint64_t>(std::llround(rate * 4294967296.0))),
        scale_(rate > 0.0 ? 1.0 / (1.0 - rate) : 1.0),
        key_(Mix(static_cast<uint64_t>(seed0) ^ Mix(static_cast<uint64_t>(seed1) + kGolden))) {}

  bool active() const { return active_; }
  double scale() const { return scale_; }

  // factor[c] (scale if kept, else 0) for elements (row, 0 .. n - 1).
  template <typename Acc>
  RECOPS_INLINE void Factors(uint64_t row, int64_t n, Acc* __restrict factor) const {
    const Acc scale = static_cast<Acc>(scale_);
    const uint32_t row_key = static_cast<uint32_t>(Mix(key_ + row * kGolden));
    const uint64_t threshold = threshold_;
    for (int64_t c = 0; c < n; ++c) {
      const uint32_t h = Hash32(row_key ^ static_cast<uint32_t>(c));
      factor[c] = static_cast<uint64_t>(h) >= threshold ? scale : Acc(0);
    }
  }

 private:
  static constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
  static RECOPS_INLINE uint64_t Mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  static RECOPS_INLINE uint32_t Hash32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
  }

  bool active_;
  uint64_t threshold_;
  double scale_;
  uint64_t key_;
};

// Deterministic column sums for the affine parameters' gradients: rows are cut into a fixed
// number of chunks that depends only on the row count; each chunk sums its rows in order
// into its own partial, and the partials are added in chunk order. So the result does not
// depend on the thread count.
template <typename Acc>
class ColumnPartials {
 public:
  static constexpr int64_t kMaxChunks = 64;

  // `columns` values per partial, `vectors` partial vectors per chunk (e.g. dgamma and dbeta).
  ColumnPartials(int64_t rows, int64_t columns, int vectors)
      : chunks_(std::max<int64_t>(1, std::min(kMaxChunks, rows))),
        rows_per_chunk_((rows + chunks_ - 1) / chunks_),
        columns_(columns),
        vectors_(vectors),
        data_(chunks_ * vectors * columns, Acc(0)) {}

  int64_t chunks() const { return chunks_; }
  int64_t ChunkBegin(int64_t chunk, int64_t rows) const {
    return std::min(rows, chunk * rows_per_chunk_);
  }
  // Partial vector v of a chunk.
  Acc* Partial(int64_t chunk, int v) { return data_.data() + (chunk * vectors_ + v) * columns_; }

  // out[c] = sum over chunks of partial v, converted to T.
  template <typename T>
  void Reduce(int v, T* out) const {
    for (int64_t c = 0; c < columns_; ++c) {
      Acc sum = Acc(0);
      for (int64_t k = 0; k < chunks_; ++k) sum += data_[(k * vectors_ + v) * columns_ + c];
      out[c] = FromAcc<T, Acc>(sum);
    }
  }

 private:
  int64_t chunks_, rows_per_chunk_, columns_;
  int vectors_;
  std::vector<Acc> data_;
};

}  // namespace recops

#endif  // RECOPS_KERNELS_COMMON_LAYER_NORM_H_
