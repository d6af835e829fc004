// The log time-gap buckets of HSTU's relative attention bias (spec §7), shared by the
// relative_attn_bias ops and the relative bias fused into HSTU attention.
#ifndef RECOPS_KERNELS_RELATIVE_ATTN_BIAS_H_
#define RECOPS_KERNELS_RELATIVE_ATTN_BIAS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/common/microkernels.h"

namespace recops {

// |x - y| of two int64 timestamps in unsigned arithmetic: exact for any pair.
RECOPS_INLINE uint64_t TimeGap(int64_t x, int64_t y) {
  return x >= y ? static_cast<uint64_t>(x) - static_cast<uint64_t>(y)
                : static_cast<uint64_t>(y) - static_cast<uint64_t>(x);
}

// bucket(a) = min(floor(ln(max(a, 1)) / divisor), num_buckets - 1) for integer a >= 0, in
// float64, without a logarithm per element: the smallest a of every bucket is found once
// (exactly, by evaluating the formula itself around exp(k * divisor)), and a lookup by the
// bit length of a starts within a few buckets of the answer.
class Bucketizer {
 public:
  static constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

  Bucketizer(double divisor, int64_t num_buckets) : divisor_(divisor) {
    first_.assign(num_buckets, 0);
    for (int64_t k = 1; k < num_buckets; ++k) {
      const double x = std::exp(static_cast<double>(k) * divisor);
      if (!(x < 18446744073709551616.0)) {  // beyond every uint64 gap (>= 2^64)
        first_[k] = kNever;
        continue;
      }
      uint64_t a = std::max<uint64_t>(1, static_cast<uint64_t>(std::ceil(x)));
      while (a > 1 && Formula(a - 1) >= k) --a;
      while (a < kNever && Formula(a) < k) ++a;
      first_[k] = std::max(a, first_[k - 1]);
      reachable_ = k;  // the last bucket some uint64 gap falls in
    }
    for (int e = 0; e < 64; ++e) {
      const uint64_t low = uint64_t{1} << e;  // the smallest a with bit length e + 1
      int64_t k = 0;
      while (k < reachable_ && first_[k + 1] <= low) ++k;
      start_[e] = k;
    }
  }

  int32_t operator()(uint64_t a) const {
    if (a <= 1) return 0;
    int64_t k = start_[63 - __builtin_clzll(a)];
    while (k < reachable_ && a >= first_[k + 1]) ++k;
    return static_cast<int32_t>(k);
  }

  // The last bucket any uint64 gap falls in (buckets above it are never used).
  int64_t reachable() const { return reachable_; }
  // The smallest gap of bucket k (1 <= k <= reachable()).
  uint64_t first(int64_t k) const { return first_[k]; }

 private:
  int64_t Formula(uint64_t a) const {
    return static_cast<int64_t>(std::floor(std::log(static_cast<double>(a)) / divisor_));
  }

  double divisor_;
  int64_t reachable_ = 0;
  std::vector<uint64_t> first_;  // first_[k]: the smallest gap in bucket k (k >= 1)
  int64_t start_[64];
};

// The same buckets by two table reads and one comparison, without loops or branches (for the
// fused HSTU bias, which buckets every score it computes). Gaps are split into 2^m sub-bins
// per power of two, indexed by the bit length and the m bits below the leading one; m is the
// smallest for which no sub-bin spans more than one bucket edge (ln(1 + 2^-m) < divisor
// suffices; m = 2 for the default 0.301). A sub-bin's bucket is then lo, or lo + 1 above its
// one edge. Unusable (usable() false) when that needs m > kMaxBits (divisor < ~0.004): the
// exact Bucketizer serves then.
class BucketTable {
 public:
  static constexpr int kMaxBits = 8;

  explicit BucketTable(const Bucketizer& exact) {
    for (int m = 0; m <= kMaxBits && !usable_; ++m) usable_ = Build(exact, m);
  }

  bool usable() const { return usable_; }
  int bits() const { return bits_; }
  const int32_t* lo() const { return lo_.data(); }
  const uint64_t* edge() const { return edge_.data(); }

  RECOPS_INLINE int32_t operator()(uint64_t a) const {
    const uint64_t a1 = a > 1 ? a : 1;
    const int z = __builtin_clzll(a1);
    // (a1 << z) has its leading one at bit 63; the m bits below it select the sub-bin.
    const uint64_t index = (static_cast<uint64_t>(63 - z) << bits_) + ((a1 << z) >> (63 - bits_)) -
                           (uint64_t{1} << bits_);
    return lo_[index] + static_cast<int32_t>(a > edge_[index]);
  }

 private:
  // Fills the tables for m sub-bin bits; false if a sub-bin spans two edges.
  bool Build(const Bucketizer& exact, int m) {
    const uint64_t per = uint64_t{1} << m;
    lo_.assign(64 * per, 0);
    edge_.assign(64 * per, Bucketizer::kNever);
    bits_ = m;
    for (int e = 0; e < 64; ++e) {
      for (uint64_t sub = 0; sub < per; ++sub) {
        uint64_t a_min, a_max;
        if (e >= m) {
          a_min = (per + sub) << (e - m);
          a_max = a_min + ((uint64_t{1} << (e - m)) - 1);
        } else {
          // Sub-bins narrower than one integer: the integer (per + sub) / 2^(m - e), if any.
          if ((per + sub) % (uint64_t{1} << (m - e)) != 0) continue;
          a_min = a_max = (per + sub) >> (m - e);
        }
        const int32_t k_lo = exact(a_min), k_hi = exact(a_max);
        if (k_hi - k_lo > 1) return false;
        const size_t index = e * per + sub;
        lo_[index] = k_lo;
        if (k_hi > k_lo) edge_[index] = exact.first(k_hi) - 1;  // a > edge: bucket k_hi
      }
    }
    return true;
  }

  bool usable_ = false;
  int bits_ = 0;
  std::vector<int32_t> lo_;
  std::vector<uint64_t> edge_;
};

// out[c] = table(|ts[c] - ti|) for c < n, eight gaps at a time on AVX-512 (the two table reads
// are gathers; about 5x faster than the scalar loop, which GCC does not vectorise). Call only
// where AVX-512 F/CD/DQ/VL are available.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// GCC vector extensions plus the lzcnt / gather builtins with explicit pass-through operands
// (the <immintrin.h> wrappers start from undefined registers, which GCC 12 reports as
// maybe-uninitialised once inlined).
__attribute__((target("avx512f,avx512cd,avx512dq,avx512vl,avx512bw"))) inline void BucketRowAvx512(
    const BucketTable& table, const int64_t* ts, int64_t ti, int64_t n, int32_t* out) {
  typedef long long I64 __attribute__((vector_size(64)));
  typedef unsigned long long U64 __attribute__((vector_size(64)));
  typedef int I32 __attribute__((vector_size(32)));
  const uint64_t bits = static_cast<uint64_t>(table.bits());
  const I64 zero{};
  const I32 zero32{};
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) {
    I64 t;
    std::memcpy(&t, ts + c, sizeof(t));
    // The unsigned gap: max - min, subtracted as unsigned (exact modulo 2^64; a signed
    // subtraction would overflow, undefined behaviour, for gaps over 2^63: UBSan found it).
    const I64 hi = t > ti ? t : ti, lo = t > ti ? ti : t;
    const U64 a = (U64)hi - (U64)lo;
    const U64 a1 = a > 1 ? a : 1;
    const U64 z = (U64)__builtin_ia32_vplzcntq_512_mask((I64)a1, zero, 0xff);
    const U64 sub = ((a1 << z) >> (63 - bits)) - (uint64_t{1} << bits);
    const I64 index = (I64)(((63 - z) << bits) + sub);
    I32 k = (I32)__builtin_ia32_gatherdiv16si(zero32, table.lo(), index, 0xff, 4);
    const U64 edge = (U64)__builtin_ia32_gatherdiv8di(zero, table.edge(), index, 0xff, 8);
    k += __builtin_convertvector(a > edge, I32) & 1;
    std::memcpy(out + c, &k, sizeof(k));
  }
  for (; c < n; ++c) out[c] = table(TimeGap(ts[c], ti));
}
#endif

// The position bias (relative_attn_bias_pos): rows of the [S2, S2] matrices per work item of
// the op and of its gradient. A fixed count, so that every sum of the gradient has one order
// whatever the thread count.
constexpr int64_t kPosBiasRows = 16;

// The row of rel_pos_bias that row i of a sequence with `len` cached positions reads: rows
// past the cached length reuse the row of the last valid position.
RECOPS_INLINE int64_t PosBiasRow(int64_t i, int64_t len) { return i < len ? i : len; }

// One row of the position bias: out[j] = (1 - e[j]) * p[j] + e[j] * p00 for j < n (e a row of
// the identity, p the row of rel_pos_bias it reads).
template <typename T, typename Acc>
RECOPS_INLINE void PosBiasRowValues(const T* __restrict e, const T* __restrict p, Acc p00,
                                    int64_t n, T* __restrict out) {
  for (int64_t j = 0; j < n; ++j) {
    const Acc ej = ToAcc<T, Acc>(e[j]);
    out[j] = FromAcc<T, Acc>((Acc(1) - ej) * ToAcc<T, Acc>(p[j]) + ej * p00);
  }
}

// One row g of the position bias's upstream gradient into the gradient's sums, j < n:
// dp[j] += g[j] (1 - e[j]) (rel_pos_bias's row p), di[j] += g[j] (p00 - p[j]) (the identity's
// row e), corner[j] += g[j] e[j] (what rel_pos_bias[0, 0] receives through the identity).
template <typename T, typename Acc>
RECOPS_INLINE void PosBiasGradRow(const T* __restrict g, const T* __restrict e,
                                  const T* __restrict p, Acc p00, int64_t n, Acc* __restrict dp,
                                  Acc* __restrict di, Acc* __restrict corner) {
  for (int64_t j = 0; j < n; ++j) {
    const Acc gj = ToAcc<T, Acc>(g[j]), ej = ToAcc<T, Acc>(e[j]);
    dp[j] += gj * (Acc(1) - ej);
    di[j] += gj * (p00 - ToAcc<T, Acc>(p[j]));
    corner[j] += gj * ej;
  }
}

}  // namespace recops

#endif  // RECOPS_KERNELS_RELATIVE_ATTN_BIAS_H_
