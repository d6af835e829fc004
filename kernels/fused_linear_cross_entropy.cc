// The tiles of stem fused_linear_cross_entropy (see the header): preparation, the lanes'
// forward and backward over blocks of items, the merge and the sparse corrections.
#include "kernels/fused_linear_cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <type_traits>

#include "kernels/common/dispatch.h"
#include "kernels/common/dtypes.h"
#include "kernels/common/microkernels.h"
#include "kernels/common/parallel.h"
#include "tensorflow/core/framework/numeric_types.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/types.h"

namespace recops {

namespace {

constexpr int64_t kPb = kFlcePositions, kNb = kFlceItems;
// Rows of a tile's logits made at a time (the forward, the bfloat16 backward): 64 x 64 floats,
// 16 KiB, which L1 holds as they are read back.
constexpr int64_t kTileRows = 64;
// The most columns past d rounded down to 16 that dE takes by dot products (ItemGradientRows):
// each costs 4 vector FMAs a row and block of positions (and a tree sum a row and group of
// blocks), where a vector of columns costs 64 a row and block.
constexpr int64_t kDeTailMax = 4;

// What forward and backward share, in the accumulation type: the active positions (weight not
// 0) packed, their states as [Pad x d] rows and as blocks of [d x kPb] columns, the extra
// logits by active position sorted by item, the bias, the items' column sums.
template <typename Acc>
struct Prepared {
  int64_t Pa = 0, Pad = 0, blocks = 0;
  int64_t dp = 0;    // d rounded up to 16: the GEMMs' widths in whole vectors (zero columns)
  int64_t dcut = 0;  // dE's columns made by the float GEMM (ItemGradientRows); dp or below d
  std::vector<int64_t> rows;  // active position -> position
  std::vector<int64_t> y;     // its target
  std::vector<Acc> w;         // its weight
  std::vector<Acc> sa;        // [Pad x dp]
  std::vector<Acc> st;        // [blocks x dp x kPb]
  std::vector<Acc> s_tail;    // [blocks x (d - dcut) x kPb] Sᵀ's rows dcut.. (unscaled), or empty
  bool st_scaled = false;     // st holds S / temperature (the float GEMM's path: no pass to scale)
  std::vector<int64_t> ex_start, ex_item, ex_index;  // CSR [Pa + 1]; item; the triple's index
  std::vector<Acc> ex_val;
  std::vector<Acc> bias;      // [N] or empty
  std::vector<Acc> zy;        // [Pa] the target's logit
  std::vector<Acc> zmean;     // [Pa] the mean logit (label smoothing only)
  std::vector<Acc> colsum;    // [d] the items' column sums (label smoothing only)
  std::vector<Acc> inv_norm;  // [N] 1 / max(|e_j|, 1e-6) with normalize_items, else empty
};

template <typename T, typename Acc>
RECOPS_INLINE Acc Val(const T* p, int64_t i) {
  return ToAcc<T, Acc>(p[i]);
}

// Whether the GEMMs take the CPU's bfloat16 dot products (bfloat16 inputs, float sums).
template <typename T>
bool UseBf16Gemm() {
  return std::is_same_v<T, Eigen::bfloat16> && Bf16DotPath();
}

// Item j's value k as the logits see it: l2-normalised (as tf.math.l2_normalize with epsilon
// 1e-12) with normalize_items, then rounded back to bfloat16 for bfloat16 inputs.
template <typename T, typename Acc>
RECOPS_INLINE Acc ItemValue(const FlceInputs<T>& in, const Prepared<Acc>& pr, int64_t j,
                            int64_t k) {
  const Acc v = Val<T, Acc>(in.items, j * in.d + k);
  if (pr.inv_norm.empty()) return v;
  if constexpr (std::is_same_v<T, Eigen::bfloat16>) {
    return RoundTo<Eigen::bfloat16, float>(v * pr.inv_norm[j]);
  } else {
    return v * pr.inv_norm[j];
  }
}

template <typename T, typename Acc>
Prepared<Acc> Prepare(tensorflow::OpKernelContext* ctx, const FlceInputs<T>& in) {
  Prepared<Acc> pr;
  const int64_t P = in.P, d = in.d, N = in.N;
  std::vector<int64_t> active_of(P, -1);
  for (int64_t p = 0; p < P; ++p) {
    const Acc w = in.weights == nullptr ? Acc(1) : Val<T, Acc>(in.weights, p);
    if (w == Acc(0)) continue;
    active_of[p] = static_cast<int64_t>(pr.rows.size());
    pr.rows.push_back(p);
    pr.y.push_back(in.targets[p]);
    pr.w.push_back(w);
  }
  pr.Pa = static_cast<int64_t>(pr.rows.size());
  pr.blocks = (pr.Pa + kPb - 1) / kPb;
  pr.Pad = pr.blocks * kPb;
  pr.dp = (d + 15) / 16 * 16;
  const int64_t dp = pr.dp;
  pr.sa.assign(pr.Pad * dp, Acc(0));
  pr.st.assign(pr.Pad * dp, Acc(0));
  // dE's last d mod 16 columns, where they are 1 to kDeTailMax, by dot products along the
  // positions (ItemGradientRows) instead of a vector of columns mostly zero.
  const int64_t dcut = d / 16 * 16, tail = d - dcut;
  pr.dcut = !UseBf16Gemm<T>() && dcut > 0 && tail > 0 && tail <= kDeTailMax ? dcut : dp;
  if (pr.dcut < d) pr.s_tail.assign(pr.blocks * tail * kPb, Acc(0));
  // Off the bfloat16 GEMM (whose operands must stay exact bfloat16 values) the temperature
  // goes into the transposed states, so a tile needs no pass to scale its logits.
  pr.st_scaled = !UseBf16Gemm<T>();
  const Acc st_scale = pr.st_scaled ? Acc(1) / static_cast<Acc>(in.temperature) : Acc(1);
  ParallelFor(ctx, pr.Pa, 4 * d + 8, [&](int64_t a0, int64_t a1) {
    for (int64_t a = a0; a < a1; ++a) {
      const T* src = in.states + pr.rows[a] * d;
      Acc* row = pr.sa.data() + a * dp;
      Acc* col = pr.st.data() + (a / kPb) * dp * kPb + a % kPb;
      for (int64_t k = 0; k < d; ++k) {
        row[k] = Val<T, Acc>(src, k);
        col[k * kPb] = row[k] * st_scale;
      }
      if (pr.dcut < d) {
        Acc* tcol = pr.s_tail.data() + (a / kPb) * tail * kPb + a % kPb;
        for (int64_t k = pr.dcut; k < d; ++k) tcol[(k - pr.dcut) * kPb] = row[k];
      }
    }
  });
  if (in.normalize_items) {
    pr.inv_norm.resize(N);
    ParallelFor(ctx, N, 4 * d + 8, [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) {
        Acc ss = 0;
        for (int64_t k = 0; k < d; ++k)
          ss += Val<T, Acc>(in.items, j * d + k) * Val<T, Acc>(in.items, j * d + k);
        pr.inv_norm[j] = Acc(1) / std::sqrt(std::max(ss, static_cast<Acc>(1e-12)));
      }
    });
  }
  if (in.bias != nullptr) {
    pr.bias.resize(N);
    for (int64_t j = 0; j < N; ++j) pr.bias[j] = Val<T, Acc>(in.bias, j);
  }
  // Extra logits of active positions, by position then item (counting sort, then by item).
  const int64_t K = static_cast<int64_t>(in.extra_positions.size());
  pr.ex_start.assign(pr.Pa + 1, 0);
  for (int64_t k = 0; k < K; ++k) {
    const int64_t a = active_of[in.extra_positions[k]];
    if (a >= 0) ++pr.ex_start[a + 1];
  }
  std::partial_sum(pr.ex_start.begin(), pr.ex_start.end(), pr.ex_start.begin());
  const int64_t kept = pr.ex_start[pr.Pa];
  pr.ex_item.resize(kept);
  pr.ex_index.resize(kept);
  pr.ex_val.resize(kept);
  {
    std::vector<int64_t> fill(pr.ex_start.begin(), pr.ex_start.end() - 1);
    for (int64_t k = 0; k < K; ++k) {
      const int64_t a = active_of[in.extra_positions[k]];
      if (a >= 0) pr.ex_index[fill[a]++] = k;
    }
  }
  for (int64_t a = 0; a < pr.Pa; ++a) {
    auto first = pr.ex_index.begin() + pr.ex_start[a],
         last = pr.ex_index.begin() + pr.ex_start[a + 1];
    std::stable_sort(first, last,
                     [&](int64_t x, int64_t z) { return in.extra_items[x] < in.extra_items[z]; });
  }
  for (int64_t e = 0; e < kept; ++e) {
    pr.ex_item[e] = in.extra_items[pr.ex_index[e]];
    pr.ex_val[e] = Val<T, Acc>(in.extra_values, pr.ex_index[e]);
  }
  // The items' column sums (label smoothing's mean logit), in a fixed order.
  const bool smoothing = in.label_smoothing != 0.0f;
  if (smoothing) {
    const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(64, N / 256));
    std::vector<Acc> part(chunks * d, Acc(0));
    ParallelFor(ctx, chunks, (N / chunks + 1) * d * 2, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        Acc* out = part.data() + c * d;
        for (int64_t j = c * N / chunks; j < (c + 1) * N / chunks; ++j) {
          for (int64_t k = 0; k < d; ++k) out[k] += ItemValue(in, pr, j, k);
        }
      }
    });
    pr.colsum.assign(d, Acc(0));
    for (int64_t c = 0; c < chunks; ++c) {
      for (int64_t k = 0; k < d; ++k) pr.colsum[k] += part[c * d + k];
    }
  }
  Acc bias_sum = 0;
  for (const Acc b : pr.bias) bias_sum += b;
  // The target's logit and the mean logit of each active position.
  const Acc inv_tau = Acc(1) / static_cast<Acc>(in.temperature);
  pr.zy.resize(pr.Pa);
  if (smoothing) pr.zmean.resize(pr.Pa);
  ParallelFor(ctx, pr.Pa, 8 * d + 16, [&](int64_t a0, int64_t a1) {
    for (int64_t a = a0; a < a1; ++a) {
      const Acc* s = pr.sa.data() + a * dp;
      const int64_t y = pr.y[a];
      Acc dot = 0;
      for (int64_t k = 0; k < d; ++k) dot += s[k] * ItemValue(in, pr, y, k);
      Acc z = dot * inv_tau + (pr.bias.empty() ? Acc(0) : pr.bias[y]);
      Acc extra_sum = 0;
      for (int64_t e = pr.ex_start[a]; e < pr.ex_start[a + 1]; ++e) {
        extra_sum += pr.ex_val[e];
        if (pr.ex_item[e] == y) z += pr.ex_val[e];
      }
      pr.zy[a] = z;
      if (smoothing) {
        Acc cdot = 0;
        for (int64_t k = 0; k < d; ++k) cdot += s[k] * pr.colsum[k];
        pr.zmean[a] = (cdot * inv_tau + bias_sum + extra_sum) / static_cast<Acc>(N);
      }
    }
  });
  return pr;
}

// exp of a vector of x <= 0 (a logit minus a max or a logsumexp; NaN passes). Float on
// AVX-512: Cephes' polynomial as ExpVec, its power of two applied by vscalefps (exact, to 0
// below -104) instead of clamping and building the exponent's bits: 4 instructions fewer a
// vector, the price of the tiles' softmax beside their GEMMs. With kLow (bfloat16 inputs: the
// backward's softmax gradient is rounded to bfloat16, 2^-9 relative, right after; the
// forward's sums of exp, whose inputs are bfloat16 products, are well inside bfloat16's
// tolerance at 1e-4) 2^(x log2 e) with the fraction from vreduceps on a cubic (minimax in
// relative error on [-1/2, 1/2]), relative error below 1e-4: 8 instructions a vector against
// 11 for the degree-4 form it replaced, and at d 50 the tiles' exp is most of the bfloat16
// loss's time (P 2,000, N 1,000,000: forward 449 -> 376 ms, forward + backward 1,615 -> 1,441
// ms). ExpVec elsewhere; std::exp for double.
template <typename V, typename Acc, Isa I, bool kLow = false>
RECOPS_INLINE V ExpOf(V x) {
  if constexpr (std::is_same_v<Acc, float>) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    if constexpr (I == Isa::kAvx512) {
      typedef float V16 __attribute__((vector_size(64)));
      if constexpr (kLow) {
        // 2^t, t = x log2(e): t's fraction f in [-1/2, 1/2] (vreduceps) on a cubic.
        V t = x * 1.44269504088896341f;
        t = t < -150.0f ? V{} - 150.0f : t;
        const V f = (V)__builtin_ia32_reduceps512_mask((V16)t, 0, (V16)t, (uint16_t)0xffff);
        V q = V{} + 5.51716685e-2f;
        q = q * f + 2.42611140e-1f;
        q = q * f + 6.93260968e-1f;
        q = q * f + 9.99928057e-1f;
        return (V)__builtin_ia32_scalefps512_mask((V16)q, (V16)(t - f), (V16)q, (uint16_t)0xffff,
                                                  4);
      }
      x = x < -104.0f ? V{} - 104.0f : x;
      V n;
      const V p = ExpMantissa(x, &n);
      return (V)__builtin_ia32_scalefps512_mask((V16)p, (V16)n, (V16)p, (uint16_t)0xffff, 4);
    }
#endif
    return ExpVec(x);
  } else {
    for (int l = 0; l < static_cast<int>(sizeof(V) / sizeof(Acc)); ++l) x[l] = std::exp(x[l]);
    return x;
  }
}

template <typename V>
RECOPS_INLINE V MaxOf(V a, V b) {
  return a > b ? a : b;
}

// C (+)= A·B on the kernel's GEMM: the bfloat16 dot products for bfloat16 inputs where the
// CPU has them, the register-blocked float / double GEMM otherwise.
template <typename Acc, Isa I, bool kOverwrite, bool kTransA>
RECOPS_INLINE void Gemm(bool bf16, int64_t M, int64_t N, int64_t K, const Acc* a, int64_t lda,
                        const Acc* B, int64_t ldb, Acc* C, int64_t ldc) {
  if constexpr (std::is_same_v<Acc, float>) {
    if (bf16) {
      GemmBf16<kOverwrite, kTransA>(M, N, K, a, lda, B, ldb, C, ldc);
      return;
    }
  }
  GemmAcc<Acc, I, kOverwrite, kTransA>(M, N, K, a, lda, B, ldb, C, ldc);
}

// The forward GEMM's depth: d itself on the float GEMM (K is its loop count, not a vector
// width: the zero columns of dp would be multiplied for nothing), dp for bfloat16 (pairs).
RECOPS_INLINE int64_t GemmDepth(bool bf16, int64_t d, int64_t dp) { return bf16 ? dp : d; }

// The sum of a vector's lanes, halves added in a fixed tree (the same on every path).
template <typename Acc, int Bytes>
RECOPS_INLINE Acc SumLanes(typename Vec<Acc, Bytes>::type x) {
  if constexpr (Bytes == sizeof(Acc)) {
    return x[0];
  } else {
    typename Vec<Acc, Bytes / 2>::type lo, hi;
    std::memcpy(&lo, &x, Bytes / 2);
    std::memcpy(&hi, reinterpret_cast<const char*>(&x) + Bytes / 2, Bytes / 2);
    return SumLanes<Acc, Bytes / 2>(lo + hi);
  }
}

// dE rows [nr x d] (+)= G·S on the float GEMM: G [nr x kPb] a tile's softmax gradient (items x
// the positions of block pb), S those positions' states (unscaled), dE dp apart. Columns up to
// pr.dcut by the GEMM; at d 50, its last 2 (pr.s_tail) by dot products along the positions, where
// a fourth vector of columns (64 for 50) made the GEMM 28% zeros: their lanes' sums go on in
// `partial` ([nr x (d - dcut)] vectors of Vec<Acc>'s lanes, kept across the blocks of positions
// that share the tile) until TailToRows adds them up.
template <typename Acc, Isa I, bool kOverwrite>
RECOPS_INLINE void ItemGradientRows(const Prepared<Acc>& pr, int64_t d, int64_t nr, int64_t pb,
                                    const Acc* g, Acc* de, Acc* partial) {
  const int64_t dp = pr.dp, dcut = pr.dcut;
  GemmAcc<Acc, I, kOverwrite, false>(nr, dcut, kPb, g, kPb, pr.sa.data() + pb * kPb * dp, dp, de,
                                     dp);
  if (dcut >= d) return;
  using V = typename Vec<Acc>::type;
  constexpr int64_t W = Vec<Acc>::kLanes;
  const int64_t tail = d - dcut;
  const Acc* sb = pr.s_tail.data() + pb * tail * kPb;
  for (int64_t c = 0; c < tail; ++c) {
    V sv[kPb / W];  // the column's states in registers (partial's stores may alias sb)
    for (int64_t v = 0; v < kPb / W; ++v) sv[v] = LoadVec<V>(sb + c * kPb + v * W);
    for (int64_t j = 0; j < nr; ++j) {
      Acc* at = partial + (j * tail + c) * W;
      V acc = LoadVec<V>(at);
      for (int64_t v = 0; v < kPb / W; ++v) acc += LoadVec<V>(g + j * kPb + v * W) * sv[v];
      StoreVec(at, acc);
    }
  }
}

// dE rows [nr x d]' columns pr.dcut.. (+)= the lanes' sums of ItemGradientRows' `partial`,
// which is zeroed for the next tile.
template <typename Acc, bool kOverwrite>
RECOPS_INLINE void TailToRows(const Prepared<Acc>& pr, int64_t d, int64_t nr, Acc* de,
                              Acc* partial) {
  using V = typename Vec<Acc>::type;
  constexpr int64_t W = Vec<Acc>::kLanes;
  const int64_t dcut = pr.dcut, tail = d - dcut;
  for (int64_t j = 0; j < nr && dcut < d; ++j) {
    for (int64_t c = 0; c < tail; ++c) {
      Acc* at = partial + (j * tail + c) * W;
      const Acc sum = SumLanes<Acc, sizeof(V)>(LoadVec<V>(at));
      StoreVec(at, V{});
      Acc& out = de[j * pr.dp + dcut + c];
      out = kOverwrite ? sum : out + sum;
    }
  }
}

// Bf16RegisterOperand for float buffers (the bfloat16 GEMMs' operands); nothing for double.
template <typename Acc>
RECOPS_INLINE void Register(const Acc* base, int64_t rows, int64_t ld) {
  if constexpr (std::is_same_v<Acc, float>) Bf16RegisterOperand(base, rows, ld);
}

// A lane's view of one block of items [j0, j0 + nb): their rows as Acc, dp apart (the input
// itself where that is already so, a converted or zero-padded copy otherwise).
template <typename T, typename Acc>
RECOPS_INLINE const Acc* ItemRows(const FlceInputs<T>& in, const Prepared<Acc>& pr, int64_t j0,
                                  int64_t nb, std::vector<Acc>* buf) {
  const int64_t d = in.d, dp = pr.dp;
  if constexpr (std::is_same_v<T, Acc>) {
    if (dp == d && pr.inv_norm.empty()) return in.items + j0 * d;
  }
  if (static_cast<int64_t>(buf->size()) < nb * dp) buf->assign(nb * dp, Acc(0));
  for (int64_t j = 0; j < nb; ++j) {
    Acc* row = buf->data() + j * dp;
    for (int64_t k = 0; k < d; ++k) row[k] = ItemValue(in, pr, j0 + j, k);
  }
  return buf->data();
}

// The factor zs of a tile's values to logits: 1 where st holds S / temperature, 1 / temperature
// on the bfloat16 GEMM (whose operands must stay bfloat16 numbers): the tile holds z / zs,
// its readers multiply by zs as they subtract the max or the logsumexp (one FMA), and no pass
// scales it.
template <typename Acc>
RECOPS_INLINE Acc TileScale(const Prepared<Acc>& pr, Acc inv_tau) {
  return pr.st_scaled ? Acc(1) : inv_tau;
}

// Logits of the tile [nb x kPb] (items x positions of block pb) in place, in units of 1 / zs
// (TileScale): the bias and the extra logits added, divided by zs (cursor: the lane's next
// extra of each active position, advanced past this block; first: where it stood, for the
// backward's second pass).
template <typename Acc, Isa I>
RECOPS_INLINE void TileLogits(const Prepared<Acc>& pr, Acc zs, int64_t j0, int64_t nb, int64_t pb,
                              Acc* tile, int64_t* cursor, int64_t* first) {
  using V = typename IsaVec<Acc, I>::type;
  constexpr int64_t W = IsaVec<Acc, I>::kLanes;
  const Acc unit = zs == Acc(1) ? Acc(1) : Acc(1) / zs;
  for (int64_t j = 0; j < nb && !pr.bias.empty(); ++j) {
    const Acc b = pr.bias[j0 + j] * unit;
    Acc* row = tile + j * kPb;
    for (int64_t v = 0; v < kPb; v += W) StoreVec(row + v, LoadVec<V>(row + v) + b);
  }
  if (pr.ex_item.empty()) return;
  const int64_t a0 = pb * kPb, a1 = std::min(a0 + kPb, pr.Pa);
  for (int64_t a = a0; a < a1; ++a) {
    int64_t e = cursor[a];
    const int64_t end = pr.ex_start[a + 1];
    while (e < end && pr.ex_item[e] < j0) ++e;
    first[a - a0] = e;
    for (; e < end && pr.ex_item[e] < j0 + nb; ++e)
      tile[(pr.ex_item[e] - j0) * kPb + (a - a0)] += pr.ex_val[e] * unit;
    cursor[a] = e;
  }
}

// One lane of the forward: blocks of items lane, lane + lanes, ... (a fixed share, so that
// every sum is made in the same order from run to run), the running max m and sum
// s of exp(z - m) of every active position over the lane's items.
template <typename T, typename Acc, Isa I>
RECOPS_INLINE void ForwardLane(const FlceInputs<T>& in, const Prepared<Acc>& pr, int64_t lane,
                               int64_t lanes, Acc* m, Acc* s) {
  using V = typename IsaVec<Acc, I>::type;
  constexpr int64_t W = IsaVec<Acc, I>::kLanes;
  constexpr int64_t NV = kPb / W;
  const bool bf16 = UseBf16Gemm<T>();
  // bfloat16 inputs: the cubic exp (relative error below 1e-4, far inside bfloat16's 2^-9).
  constexpr bool kLowExp = std::is_same_v<T, Eigen::bfloat16>;
  const Acc zs = TileScale(pr, Acc(1) / static_cast<Acc>(in.temperature));
  const Acc neg_inf = -std::numeric_limits<Acc>::infinity();
  std::fill(m, m + pr.Pad, neg_inf);
  std::fill(s, s + pr.Pad, Acc(0));
  std::vector<Acc> tile(kTileRows * kPb), rows;
  std::vector<int64_t> cursor(pr.ex_start.begin(), pr.ex_start.end() - 1), first(kPb);
  const int64_t dp = pr.dp;
  Bf16Item item(bf16);
  if (bf16) Register(pr.st.data(), pr.blocks * dp, kPb);
  for (int64_t blk = lane; blk * kNb < in.N; blk += lanes) {
    const int64_t j0 = blk * kNb, nb = std::min(kNb, in.N - j0);
    const Acc* e = ItemRows<T, Acc>(in, pr, j0, nb, &rows);
    if (bf16) Register(e, nb, dp);
    for (int64_t pb = 0; pb < pr.blocks; ++pb) {
      // Rows of the tile kTileRows at a time: each part's logits are read back (max, then exp)
      // while in L1.
      for (int64_t r0 = 0; r0 < nb; r0 += kTileRows) {
        const int64_t nr = std::min(kTileRows, nb - r0);
        Gemm<Acc, I, true, false>(bf16, nr, kPb, GemmDepth(bf16, in.d, dp), e + r0 * dp, dp,
                                  pr.st.data() + pb * dp * kPb, kPb, tile.data(), kPb);
        TileLogits<Acc, I>(pr, zs, j0 + r0, nr, pb, tile.data(), cursor.data(), first.data());
        V bm[NV], mm[NV], ss[NV];
        for (int64_t v = 0; v < NV; ++v) bm[v] = V{} + neg_inf;
        for (int64_t j = 0; j < nr; ++j) {
          for (int64_t v = 0; v < NV; ++v) bm[v] = MaxOf(bm[v], LoadVec<V>(&tile[j * kPb + v * W]));
        }
        Acc* mp = m + pb * kPb;
        Acc* sp = s + pb * kPb;
        for (int64_t v = 0; v < NV; ++v) {
          bm[v] *= zs;  // zs > 0: the max of the logits
          const V old = LoadVec<V>(mp + v * W);
          mm[v] = MaxOf(old, bm[v]);
          // A position whose logits are all -inf so far keeps m = -inf and s = 0.
          mm[v] = mm[v] == neg_inf ? V{} : mm[v];
          ss[v] = LoadVec<V>(sp + v * W) * ExpOf<V, Acc, I>(old - mm[v]);
        }
        for (int64_t j = 0; j < nr; ++j) {
          for (int64_t v = 0; v < NV; ++v)
            ss[v] += ExpOf<V, Acc, I, kLowExp>(LoadVec<V>(&tile[j * kPb + v * W]) * zs - mm[v]);
        }
        for (int64_t v = 0; v < NV; ++v) {
          StoreVec(mp + v * W, MaxOf(LoadVec<V>(mp + v * W), bm[v]));
          StoreVec(sp + v * W, ss[v]);
        }
        // m holds the true max (-inf where there is none); s is relative to it, or to 0 where
        // m is -inf.
      }
    }
  }
}

// The end of an item block's backward: the one-hot term of the block's targets, the uniform
// term, the temperature (and the normalisation's Jacobian) applied to its dE rows `de` (dp
// apart) and dbias sums `db`, written to ditems and dbias.
template <typename T, typename Acc, typename O>
RECOPS_INLINE void FinishItemBlock(const FlceInputs<T>& in, const Prepared<Acc>& pr,
                                   const std::vector<Acc>& onehot,
                                   const std::vector<Acc>& uniform_de, Acc uniform_db,
                                   const std::vector<int64_t>& by_target, int64_t j0, int64_t nb,
                                   Acc* de, Acc* db, O* ditems, O* dbias) {
  const int64_t d = in.d, dp = pr.dp;
  const Acc inv_tau = Acc(1) / static_cast<Acc>(in.temperature);
  {
    const auto lo = std::lower_bound(by_target.begin(), by_target.end(), j0,
                                     [&](int64_t a, int64_t j) { return pr.y[a] < j; });
    for (auto it = lo; it != by_target.end() && pr.y[*it] < j0 + nb; ++it) {
      const int64_t a = *it, j = pr.y[a] - j0;
      for (int64_t k = 0; k < d; ++k) de[j * dp + k] -= onehot[a] * pr.sa[a * dp + k];
      db[j] -= onehot[a];
    }
    for (int64_t j = 0; j < nb; ++j) {
      O* out = ditems + (j0 + j) * d;
      Acc* g = de + j * dp;
      for (int64_t k = 0; k < d; ++k)
        g[k] = (g[k] - (uniform_de.empty() ? Acc(0) : uniform_de[k])) * inv_tau;
      if (!pr.inv_norm.empty()) {
        // Through e / max(|e|, 1e-6): the gradient's component along e removed, scaled by
        // the inverse norm (only scaled where the norm was clamped), as tf.math.l2_normalize.
        const Acc inv = pr.inv_norm[j0 + j];
        Acc ss = 0, dot = 0;
        for (int64_t k = 0; k < d; ++k) {
          const Acc x = Val<T, Acc>(in.items, (j0 + j) * d + k);
          ss += x * x;
          dot += g[k] * x;
        }
        const Acc along = ss < static_cast<Acc>(1e-12) ? Acc(0) : dot * inv * inv;
        for (int64_t k = 0; k < d; ++k)
          g[k] = inv * (g[k] - along * Val<T, Acc>(in.items, (j0 + j) * d + k));
      }
      for (int64_t k = 0; k < d; ++k) out[k] = FromAcc<O, Acc>(g[k]);
      if (dbias != nullptr) dbias[j0 + j] = FromAcc<O, Acc>(db[j] - uniform_db);
    }
  }
}

// One lane of the backward on the float GEMM (float, double, and bfloat16 inputs where the CPU
// has no bfloat16 dot products; BackwardLaneBf16 where it has): blocks of items lane,
// lane + lanes, ...; per block, every tile's G = c
// exp(z - lse) (c = 0 on padding), the extra logits' gradients read from it, dE of the block's rows
// (G·S, written out with the one-hot and smoothing corrections), dbias, and dS into the lane's
// own buffer ds [Pad x d].
template <typename T, typename Acc, Isa I, typename O>
RECOPS_INLINE void BackwardLane(const FlceInputs<T>& in, const Prepared<Acc>& pr,
                                const std::vector<Acc>& c, const std::vector<Acc>& lse_a,
                                const std::vector<Acc>& onehot, const std::vector<Acc>& uniform_de,
                                Acc uniform_db, const std::vector<int64_t>& by_target, int64_t lane,
                                int64_t lanes, Acc* ds, O* ditems, O* dbias, Acc* dextra) {
  using V = typename IsaVec<Acc, I>::type;
  constexpr int64_t W = IsaVec<Acc, I>::kLanes;
  constexpr int64_t NV = kPb / W;
  constexpr bool kRoundG = std::is_same_v<T, Eigen::bfloat16>;
  const Acc zs = TileScale(pr, Acc(1) / static_cast<Acc>(in.temperature));
  const int64_t d = in.d;
  const int64_t dp = pr.dp;
  std::vector<Acc> tile(kTileRows * kPb), rows, de(kNb * dp), db(kNb);
  const int64_t tail = d - std::min(d, pr.dcut);  // dE's columns by ItemGradientRows' dots
  std::vector<Acc> partial(kNb * tail * Vec<Acc>::kLanes);
  std::vector<int64_t> cursor(pr.ex_start.begin(), pr.ex_start.end() - 1), first(kPb);
  for (int64_t blk = lane; blk * kNb < in.N; blk += lanes) {
    const int64_t j0 = blk * kNb, nb = std::min(kNb, in.N - j0);
    const Acc* e = ItemRows<T, Acc>(in, pr, j0, nb, &rows);
    std::fill(de.begin(), de.begin() + nb * dp, Acc(0));
    std::fill(db.begin(), db.begin() + nb, Acc(0));
    for (int64_t pb = 0; pb < pr.blocks; ++pb) {
      V cv[NV], lv[NV];
      for (int64_t v = 0; v < NV; ++v) {
        cv[v] = LoadVec<V>(&c[pb * kPb + v * W]);
        lv[v] = LoadVec<V>(&lse_a[pb * kPb + v * W]);
      }
      // Rows of the tile kTileRows at a time, so that each part's logits and G are read back
      // from L1; dSᵀ's sums go on from part to part in item order (the same FMA chains).
      for (int64_t r0 = 0; r0 < nb; r0 += kTileRows) {
        const int64_t nr = std::min(kTileRows, nb - r0);
        Acc* t = tile.data();
        const Acc* er = e + r0 * dp;
        Gemm<Acc, I, true, false>(false, nr, kPb, d, er, dp, pr.st.data() + pb * dp * kPb, kPb, t,
                                  kPb);
        TileLogits<Acc, I>(pr, zs, j0 + r0, nr, pb, t, cursor.data(), first.data());
        for (int64_t j = 0; j < nr; ++j) {
          V sum = V{};
          for (int64_t v = 0; v < NV; ++v) {
            V g = cv[v] * ExpOf<V, Acc, I, kRoundG>(LoadVec<V>(&t[j * kPb + v * W]) * zs - lv[v]);
            g = cv[v] == Acc(0) ? V{} : g;
            sum += g;
            StoreVec(&t[j * kPb + v * W], g);
          }
          if (dbias != nullptr) {  // no horizontal sums without a bias to differentiate
            Acc total = 0;
            for (int64_t l = 0; l < W; ++l) total += sum[l];
            db[r0 + j] += total;
          }
        }
        if (!pr.ex_item.empty()) {
          const int64_t a0 = pb * kPb, a1 = std::min(a0 + kPb, pr.Pa);
          for (int64_t a = a0; a < a1; ++a) {
            for (int64_t x = first[a - a0]; x < cursor[a]; ++x)
              dextra[x] = t[(pr.ex_item[x] - j0 - r0) * kPb + (a - a0)];
          }
        }
        if constexpr (kRoundG) {
          for (int64_t j = 0; j < nr; ++j) {
            for (int64_t v = 0; v < NV; ++v) {
              if constexpr (std::is_same_v<Acc, float>)
                StoreVec(&t[j * kPb + v * W],
                         RoundVecTo<Eigen::bfloat16>(LoadVec<V>(&t[j * kPb + v * W])));
            }
          }
        }
        // dE rows += G·S (S unscaled: the temperature is applied once, below); dSᵀ [d x kPb]
        // += Eᵀ·G: d rows, no zero columns.
        ItemGradientRows<Acc, I, false>(pr, d, nr, pb, t, de.data() + r0 * dp,
                                        partial.data() + r0 * tail * Vec<Acc>::kLanes);
        GemmAcc<Acc, I, false, true>(d, kPb, nr, er, dp, t, kPb, ds + pb * d * kPb, kPb);
      }
    }
    TailToRows<Acc, false>(pr, d, nb, de.data(), partial.data());  // once per block of items
    FinishItemBlock(in, pr, onehot, uniform_de, uniform_db, by_target, j0, nb, de.data(), db.data(),
                    ditems, dbias);
  }
}

// The rounded bfloat16 forms of a float vector's lanes, each in the high half of its 32 bits
// (the low half zero).
template <typename V>
RECOPS_INLINE auto Bf16Bits(V x) {
  typedef uint32_t Vu __attribute__((vector_size(sizeof(V))));
  return reinterpret_cast<Vu>(RoundVecTo<Eigen::bfloat16>(x));
}

// Pairs of consecutive values of the 2W bfloat16 forms lo ++ hi (Bf16Bits): lane q holds values
// 2q (low half) and 2q + 1 (high half), GemmBf16Packed's pairs along k.
template <typename Vu>
RECOPS_INLINE Vu PairsAlong(Vu lo, Vu hi) {
  constexpr int64_t W = sizeof(Vu) / sizeof(uint32_t);
  if constexpr (W == 16) {
    const Vu even =
        __builtin_shuffle(lo, hi, Vu{0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30});
    const Vu odd =
        __builtin_shuffle(lo, hi, Vu{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31});
    return (even >> 16) | (odd & 0xffff0000u);
  } else {
    Vu out{};
    for (int64_t q = 0; q < W; ++q) {
      const uint32_t x0 = q < W / 2 ? lo[2 * q] : hi[2 * q - W];
      const uint32_t x1 = q < W / 2 ? lo[2 * q + 1] : hi[2 * q + 1 - W];
      out[q] = (x0 >> 16) | (x1 & 0xffff0000u);
    }
    return out;
  }
}

// The bfloat16 pair (lo, hi) of two floats that are bfloat16 numbers (their bits' high halves).
RECOPS_INLINE uint32_t PairOf(float lo, float hi) {
  uint32_t x0, x1;
  std::memcpy(&x0, &lo, 4);
  std::memcpy(&x1, &hi, 4);
  return (x0 >> 16) | (x1 & 0xffff0000u);
}

// S's pairs along positions [Pad / 2 x dp] (pair row pp: positions 2pp and 2pp + 1), the
// bfloat16 dE products' B operand.
inline std::vector<uint32_t> StatePairs(const Prepared<float>& pr) {
  std::vector<uint32_t> sap(pr.Pad / 2 * pr.dp);
  for (int64_t pp = 0; pp < pr.Pad / 2; ++pp) {
    for (int64_t k = 0; k < pr.dp; ++k)
      sap[pp * pr.dp + k] = PairOf(pr.sa[2 * pp * pr.dp + k], pr.sa[(2 * pp + 1) * pr.dp + k]);
  }
  return sap;
}

// The bfloat16 forms (Bf16Bits) of G's rows i (g0) and i + 1 (g1: zeros where there is none)
// as the tiles' pairs: across the two items (dSᵀ's B: kPb words at `across`) and along
// positions, row by row (dE's A: kPb / 2 words at `along`, and at along + ldg for row i + 1
// where `pair`).
template <int64_t NV, typename Vu>
RECOPS_INLINE void StoreGradientPairs(const Vu* g0, const Vu* g1, bool pair, uint32_t* across,
                                      uint32_t* along, int64_t ldg) {
  constexpr int64_t W = sizeof(Vu) / sizeof(uint32_t);
  for (int64_t v = 0; v < NV; ++v) {
    const Vu x = (g0[v] >> 16) | (g1[v] & 0xffff0000u);
    std::memcpy(across + v * W, &x, sizeof(Vu));
  }
  for (int64_t v = 0; v < NV; v += 2) {
    const Vu p0 = PairsAlong(g0[v], g0[v + 1]);
    std::memcpy(along + v * W / 2, &p0, sizeof(Vu));
    if (pair) {
      const Vu p1 = PairsAlong(g1[v], g1[v + 1]);
      std::memcpy(along + ldg + v * W / 2, &p1, sizeof(Vu));
    }
  }
}

// Position blocks whose softmax gradient rows a bfloat16 lane keeps for one dE product: 2,048
// positions, 1 MiB of pairs for a block of 256 items.
constexpr int64_t kDeChunk = 32;

// BackwardLane for bfloat16 inputs on the CPU's bfloat16 dot products (Bf16DotPath). The
// softmax gradient G is rounded and paired as it is computed, never written as floats: along
// positions (dE = G·S's A: the rows of kDeChunk position blocks, multiplied once, their
// accumulator read and written once per chunk instead of per tile) and across items (dSᵀ =
// Eᵀ·G's B, with Eᵀ's pairs made once per item block). `sap`: S's pairs along positions
// [Pad / 2 x dp]; ds: dSᵀ blocks [blocks x dp x kPb].
template <Isa I, typename O>
RECOPS_INLINE void BackwardLaneBf16(const FlceInputs<Eigen::bfloat16>& in,
                                    const Prepared<float>& pr, const std::vector<float>& c,
                                    const std::vector<float>& lse_a,
                                    const std::vector<float>& onehot,
                                    const std::vector<float>& uniform_de, float uniform_db,
                                    const std::vector<int64_t>& by_target, int64_t lane,
                                    int64_t lanes, const uint32_t* sap, float* ds, O* ditems,
                                    O* dbias, float* dextra) {
  using V = typename IsaVec<float, I>::type;
  typedef uint32_t Vu __attribute__((vector_size(sizeof(V))));
  constexpr int64_t W = IsaVec<float, I>::kLanes;
  constexpr int64_t NV = kPb / W;
  static_assert(NV % 2 == 0, "pairs of position vectors");
  const float zs = TileScale(pr, 1.0f / in.temperature);
  const int64_t dp = pr.dp, half = kPb / 2, nh_max = kNb / 2;
  const int64_t chunk = std::min(pr.blocks, kDeChunk), ldg = chunk * half;
  std::vector<float> tile(kTileRows * kPb), rows, de(kNb * dp), db(kNb);
  std::vector<uint32_t> gp(kNb * ldg), gv(nh_max * kPb), et(dp * nh_max);
  std::vector<int64_t> cursor(pr.ex_start.begin(), pr.ex_start.end() - 1), first(kPb);
  Bf16Item item(true);
  Register(pr.st.data(), pr.blocks * dp, kPb);
  for (int64_t blk = lane; blk * kNb < in.N; blk += lanes) {
    const int64_t j0 = blk * kNb, nb = std::min(kNb, in.N - j0), nh = (nb + 1) / 2;
    const float* e = ItemRows<Eigen::bfloat16, float>(in, pr, j0, nb, &rows);
    Register(e, nb, dp);
    // Eᵀ's pairs of items (bfloat16 numbers: their forms are their bits' high halves).
    for (int64_t jj = 0; jj < nh; ++jj) {
      const float* r0 = e + 2 * jj * dp;
      const float* r1 = 2 * jj + 1 < nb ? r0 + dp : nullptr;
      for (int64_t k = 0; k < dp; ++k)
        et[k * nh_max + jj] = PairOf(r0[k], r1 == nullptr ? 0.0f : r1[k]);
    }
    std::fill(db.begin(), db.begin() + nb, 0.0f);
    for (int64_t pb0 = 0; pb0 < pr.blocks; pb0 += chunk) {
      const int64_t pbn = std::min(chunk, pr.blocks - pb0);
      for (int64_t pb = pb0; pb < pb0 + pbn; ++pb) {
        V cv[NV], lv[NV];
        for (int64_t v = 0; v < NV; ++v) {
          cv[v] = LoadVec<V>(&c[pb * kPb + v * W]);
          lv[v] = LoadVec<V>(&lse_a[pb * kPb + v * W]);
        }
        uint32_t* gcol = gp.data() + (pb - pb0) * half;
        // Rows of the tile kTileRows at a time (even: pairs of items), read back while in L1.
        for (int64_t r0 = 0; r0 < nb; r0 += kTileRows) {
          const int64_t nr = std::min(kTileRows, nb - r0);
          float* t = tile.data();
          Gemm<float, I, true, false>(true, nr, kPb, dp, e + r0 * dp, dp,
                                      pr.st.data() + pb * dp * kPb, kPb, t, kPb);
          TileLogits<float, I>(pr, zs, j0 + r0, nr, pb, t, cursor.data(), first.data());
          for (int64_t i = 0; i < nr; i += 2) {
            const int64_t j = r0 + i;
            const bool pair = i + 1 < nr;
            Vu g0[NV], g1[NV];
            V sum0 = V{}, sum1 = V{};
            for (int64_t v = 0; v < NV; ++v) {
              V g = cv[v] * ExpOf<V, float, I, true>(LoadVec<V>(&t[i * kPb + v * W]) * zs - lv[v]);
              g = cv[v] == 0.0f ? V{} : g;
              sum0 += g;
              g0[v] = Bf16Bits(g);
              if (pair) {
                V h = cv[v] *
                      ExpOf<V, float, I, true>(LoadVec<V>(&t[(i + 1) * kPb + v * W]) * zs - lv[v]);
                h = cv[v] == 0.0f ? V{} : h;
                sum1 += h;
                g1[v] = Bf16Bits(h);
              } else {
                g1[v] = Vu{};
              }
            }
            StoreGradientPairs<NV>(g0, g1, pair, &gv[(j / 2) * kPb], gcol + j * ldg, ldg);
            if (dbias != nullptr) {
              float total0 = 0, total1 = 0;
              for (int64_t l = 0; l < W; ++l) {
                total0 += sum0[l];
                total1 += sum1[l];
              }
              db[j] += total0;
              if (pair) db[j + 1] += total1;
            }
          }
          if (!pr.ex_item.empty()) {  // the extra logits' gradients, from the part's logits
            const int64_t a0 = pb * kPb, a1 = std::min(a0 + kPb, pr.Pa);
            for (int64_t a = a0; a < a1; ++a) {
              for (int64_t x = first[a - a0]; x < cursor[a]; ++x) {
                const float z = t[(pr.ex_item[x] - j0 - r0) * kPb + (a - a0)] * zs;
                dextra[x] = c[a] == 0.0f ? 0.0f : c[a] * std::exp(z - lse_a[a]);
              }
            }
          }
        }
        // dSᵀ [dp x kPb] += Eᵀ·G over the block's items.
        GemmBf16Packed<false>(dp, kPb, nh, et.data(), nh_max, gv.data(), kPb, ds + pb * dp * kPb,
                              kPb);
      }
      // dE (+)= G·S over the chunk's positions (S unscaled: the temperature comes below).
      if (pb0 == 0) {
        GemmBf16Packed<true>(nb, dp, pbn * half, gp.data(), ldg, sap + pb0 * half * dp, dp,
                             de.data(), dp);
      } else {
        GemmBf16Packed<false>(nb, dp, pbn * half, gp.data(), ldg, sap + pb0 * half * dp, dp,
                              de.data(), dp);
      }
    }
    FinishItemBlock(in, pr, onehot, uniform_de, uniform_db, by_target, j0, nb, de.data(), db.data(),
                    ditems, dbias);
  }
}

// Bytes the forward-with-gradients path may hold for its panels (RECOPS_FLCE_PANEL_MB, MiB;
// default 256): each lane's logits of one block of positions over the whole catalogue
// [N x kPb] and its own dE [N x dp], and the item rows as the GEMMs read them [N x dp]. Past
// it, FlceForwardBackward runs the forward and then the backward (4 products, no panels).
int64_t PanelBudget() {
  const char* text = std::getenv("RECOPS_FLCE_PANEL_MB");
  if (text != nullptr && *text != '\0') {
    char* end = nullptr;
    const double mb = std::strtod(text, &end);
    if (end != text && mb >= 0) return static_cast<int64_t>(mb * (1 << 20));
  }
  return int64_t{256} << 20;
}

// Blocks of positions a lane of FlceForwardBackward takes together (at most).
constexpr int64_t kPanelGroup = 4;

// Items past which FlceForwardBackward runs the forward and then the backward although the
// panels fit the budget: each lane's panel (N x 64 floats a block) then spills from the caches,
// and its second pass's reads cost more than the recomputed logits they save. One pass's time
// over forward + backward's on a 2-core Xeon with AMX (P 2,100, d 50): float32 0.80x at 12,000
// items, 0.87x at 25,000, 0.99x at 50,000, 1.07x at 100,000 (fewer blocks a group did not help:
// 1.09x at 100,000 with one); bfloat16, whose two passes both exp the logits on ExpOf's cubic,
// 0.81x at 25,000, 0.97x at 30,000, 1.04-1.06x at 35,000-40,000, 1.18-1.32x at 50,000.
template <typename T>
constexpr int64_t PanelMaxItems() {
  return std::is_same_v<T, Eigen::bfloat16> ? 30000 : 50000;
}

// What the lanes of FlceForwardBackward share besides the Prepared inputs.
template <typename Acc>
struct PanelShared {
  const Acc* items = nullptr;  // [N x dp]: the item rows as the logits see them
  std::vector<Acc> c;          // [Pad] the softmax's coefficient (the weight; 0: padding)
  Acc* lse = nullptr;          // [Pad] out
  Acc* ds = nullptr;           // [blocks x dm x kPb] dSᵀ, each block written by one lane
  Acc* dextra = nullptr;       // [extras] by the active positions' sorted extras
  // bfloat16 inputs (the tiles' operands as bfloat16 pairs, made once for every lane):
  const uint32_t* ep = nullptr;   // [N x dp / 2] the item rows, pairs along d
  const uint32_t* etp = nullptr;  // [tiles x dp x kTileRows / 2] Eᵀ, pairs of a tile's items
  const uint32_t* stp = nullptr;  // [blocks x dp / 2 x kPb] st, pairs along d
  const uint32_t* sap = nullptr;  // [Pad / 2 x dp] S, pairs along positions (StatePairs)
};

// The panel's tile after tile (t, b) in the order the passes take them (nullptr: none).
template <typename Acc>
RECOPS_INLINE Acc* NextTile(Acc* panel, int64_t t, int64_t b, int64_t nq, int64_t q,
                            int64_t tiles) {
  if (b + 1 < nq) return panel + (t * q + b + 1) * kTileRows * kPb;
  if (t + 1 < tiles) return panel + (t + 1) * q * kTileRows * kPb;
  return nullptr;
}

// The panel is read and written a tile at a time between GEMMs of thousands of cycles, too
// far apart for the hardware's streams: as each row of a tile is read, the same row of the
// next tile is fetched into L2 (for writing, in the first pass), a few lines at a time so as
// not to fill the line buffers. Without it, the second pass's loads of each tile were a third
// of its time outside the GEMMs.
template <typename Acc>
RECOPS_INLINE void PrefetchRow(const Acc* tile, int64_t j, bool write) {
  if (tile == nullptr) return;
  const char* bytes = reinterpret_cast<const char*>(tile + j * kPb);
  for (int64_t x = 0; x < kPb * static_cast<int64_t>(sizeof(Acc)); x += 64) {
    if (write) {
      __builtin_prefetch(bytes + x, 1, 2);
    } else {
      __builtin_prefetch(bytes + x, 0, 2);
    }
  }
}

// One lane of the forward with gradients: its share of the blocks of positions, in groups of
// at most q consecutive blocks; per group, (A) tile by tile of items (item order), each block's
// logits into the lane's panel (tiles [kTileRows x kPb], by tile then block: both passes walk
// it in address order) with an online logsumexp, stored as exp(z - m) for the block's running
// max m at that tile (kept per tile, `mt`), while the tile is in L1; (B) tile by tile, each
// block's softmax gradient G = c exp(z - lse) = stored x c exp(m_tile - lse), then dE rows +=
// G·S (the tile's dE rows stay in L1 across the group's blocks), dbias, and dSᵀ += Eᵀ·G. The
// logits are made once and exp'd once: 3 products where the forward and the backward make 4;
// the group shares each item tile's reads and its dE rows' read and write among q blocks.
//  - float GEMM (T = Acc): G into an L1 scratch tile, multiplied per block;
//  - bfloat16 inputs on the CPU's bfloat16 dot products (the tiles' operands packed once, in
//    `sh`): the logits' exp on the cubic, and G rounded and paired as it is made,
//    as BackwardLaneBf16 does: pairs across items for dSᵀ per block, pairs along positions for
//    dE, one product per tile over the group's positions.
template <typename T, typename Acc, Isa I>
RECOPS_INLINE void PanelLane(const FlceInputs<T>& in, const Prepared<Acc>& pr,
                             const PanelShared<Acc>& sh, int64_t lane, int64_t lanes, int64_t q,
                             Acc* panel, Acc* de, Acc* db) {
  using V = typename IsaVec<Acc, I>::type;
  constexpr int64_t W = IsaVec<Acc, I>::kLanes;
  constexpr int64_t NV = kPb / W;
  constexpr bool kBf16 = std::is_same_v<T, Eigen::bfloat16>;
  const int64_t N = in.N, d = in.d, dp = pr.dp, dm = kBf16 ? dp : d;
  const int64_t dph = dp / 2, half = kPb / 2, nh_max = kTileRows / 2, ldg = q * half;
  const Acc zs = TileScale(pr, Acc(1) / static_cast<Acc>(in.temperature));
  const Acc neg_inf = -std::numeric_limits<Acc>::infinity();
  const int64_t tiles = (N + kTileRows - 1) / kTileRows;
  std::vector<Acc> mt(q * tiles * kPb), scratch(kBf16 ? 0 : kTileRows * kPb);
  std::vector<Acc> partial(kBf16 ? 0 : kTileRows * (d - std::min(d, pr.dcut)) * Vec<Acc>::kLanes);
  std::vector<Acc> mv(q * kPb), sv(q * kPb);
  std::vector<uint32_t> gp(kBf16 ? kTileRows * ldg : 0), gv(kBf16 ? nh_max * kPb : 0);
  std::vector<int64_t> cursor(pr.ex_start.begin(), pr.ex_start.end() - 1), first(kPb);
  Bf16Item item(kBf16);
  // de needs no zeros: the lane's first group writes every row (the GEMMs' overwrite form).
  if (db != nullptr) std::fill(db, db + N, Acc(0));
  // The lane's blocks: a contiguous share (one block more or less than another lane's), in
  // groups of near-equal size, at most q each.
  const int64_t first_block = pr.blocks * lane / lanes, end_block = pr.blocks * (lane + 1) / lanes;
  const int64_t count = end_block - first_block, groups = (count + q - 1) / q;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t pb0 = first_block + count * g / groups;
    const int64_t nq = first_block + count * (g + 1) / groups - pb0;
    std::fill(mv.begin(), mv.end(), neg_inf);
    std::fill(sv.begin(), sv.end(), Acc(0));
    // (A) the logits, tile by tile, exp'd against the running max.
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t j0 = t * kTileRows, nr = std::min(kTileRows, N - j0);
      const Acc* er = kBf16 ? nullptr : sh.items + j0 * dp;  // the float GEMM's item rows
      for (int64_t b = 0; b < nq; ++b) {
        const int64_t pb = pb0 + b;
        Acc* tile = panel + (t * q + b) * kTileRows * kPb;
        Acc* next = NextTile(panel, t, b, nq, q, tiles);
        if constexpr (kBf16) {
          GemmBf16Packed<true>(nr, kPb, dph, sh.ep + j0 * dph, dph, sh.stp + pb * dph * kPb, kPb,
                               tile, kPb);
        } else {
          Gemm<Acc, I, true, false>(false, nr, kPb, d, er, dp, pr.st.data() + pb * dp * kPb, kPb,
                                    tile, kPb);
        }
        TileLogits<Acc, I>(pr, zs, j0, nr, pb, tile, cursor.data(), first.data());
        V bm[NV], mm[NV], ss[NV];
        for (int64_t v = 0; v < NV; ++v) bm[v] = V{} + neg_inf;
        for (int64_t j = 0; j < nr; ++j) {
          for (int64_t v = 0; v < NV; ++v) bm[v] = MaxOf(bm[v], LoadVec<V>(&tile[j * kPb + v * W]));
        }
        Acc* mb = mv.data() + b * kPb;
        for (int64_t v = 0; v < NV; ++v) {
          const V old = LoadVec<V>(mb + v * W);
          const V m_new = MaxOf(old, bm[v] * zs);
          // A position whose logits are all -inf so far keeps m = -inf and s = 0.
          mm[v] = m_new == neg_inf ? V{} : m_new;
          ss[v] = LoadVec<V>(sv.data() + b * kPb + v * W) * ExpOf<V, Acc, I>(old - mm[v]);
          StoreVec(mb + v * W, m_new);
          StoreVec(&mt[(b * tiles + t) * kPb + v * W], mm[v]);
        }
        for (int64_t j = 0; j < nr; ++j) {
          PrefetchRow(next, j, true);
          for (int64_t v = 0; v < NV; ++v) {
            const V x = ExpOf<V, Acc, I, kBf16>(LoadVec<V>(&tile[j * kPb + v * W]) * zs - mm[v]);
            ss[v] += x;
            StoreVec(&tile[j * kPb + v * W], x);
          }
        }
        for (int64_t v = 0; v < NV; ++v) StoreVec(sv.data() + b * kPb + v * W, ss[v]);
      }
    }
    // lse = m + log s (-inf where every logit is -inf: m = -inf, s = 0).
    for (int64_t b = 0; b < nq; ++b) {
      Acc* lse = sh.lse + (pb0 + b) * kPb;
      for (int64_t x = 0; x < kPb; ++x) {
        const Acc m = mv[b * kPb + x];
        lse[x] = m == neg_inf ? m : m + std::log(sv[b * kPb + x]);
      }
    }
    // (B) G tile by tile, then its products.
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t j0 = t * kTileRows, nr = std::min(kTileRows, N - j0);
      const Acc* er = kBf16 ? nullptr : sh.items + j0 * dp;  // the float GEMM's item rows
      for (int64_t b = 0; b < nq; ++b) {
        const int64_t pb = pb0 + b;
        const Acc* tile = panel + (t * q + b) * kTileRows * kPb;
        const Acc* next = NextTile(panel, t, b, nq, q, tiles);
        V f[NV];
        for (int64_t v = 0; v < NV; ++v) {
          const V cv = LoadVec<V>(&sh.c[pb * kPb + v * W]);
          const V x = cv * ExpOf<V, Acc, I>(LoadVec<V>(&mt[(b * tiles + t) * kPb + v * W]) -
                                            LoadVec<V>(sh.lse + pb * kPb + v * W));
          f[v] = cv == Acc(0) ? V{} : x;
        }
        if constexpr (kBf16) {
          static_assert(NV % 2 == 0, "pairs of position vectors");
          typedef uint32_t Vu __attribute__((vector_size(sizeof(V))));
          // Rows two at a time: G's pairs across items (gv, dSᵀ's B) and along positions (the
          // group's gp rows, dE's A), rounded to bfloat16 straight from the registers.
          for (int64_t i = 0; i < nr; i += 2) {
            const bool pair = i + 1 < nr;
            PrefetchRow(next, i, false);
            if (pair) PrefetchRow(next, i + 1, false);
            V sum0 = V{}, sum1 = V{};
            Vu g0[NV], g1[NV];
            for (int64_t v = 0; v < NV; ++v) {
              const V x0 = LoadVec<V>(&tile[i * kPb + v * W]) * f[v];
              sum0 += x0;
              g0[v] = Bf16Bits(x0);
              if (pair) {
                const V x1 = LoadVec<V>(&tile[(i + 1) * kPb + v * W]) * f[v];
                sum1 += x1;
                g1[v] = Bf16Bits(x1);
              } else {
                g1[v] = Vu{};
              }
            }
            StoreGradientPairs<NV>(g0, g1, pair, &gv[(i / 2) * kPb], gp.data() + i * ldg + b * half,
                                   ldg);
            if (db != nullptr) {
              Acc total0 = 0, total1 = 0;
              for (int64_t l = 0; l < W; ++l) {
                total0 += sum0[l];
                total1 += sum1[l];
              }
              db[j0 + i] += total0;
              if (pair) db[j0 + i + 1] += total1;
            }
          }
          GemmBf16Packed<false>(dm, kPb, (nr + 1) / 2, sh.etp + t * dp * nh_max, nh_max, gv.data(),
                                kPb, sh.ds + pb * dm * kPb, kPb);
        } else {
          for (int64_t j = 0; j < nr; ++j) {
            PrefetchRow(next, j, false);
            V sum = V{};
            for (int64_t v = 0; v < NV; ++v) {
              const V gx = LoadVec<V>(&tile[j * kPb + v * W]) * f[v];
              sum += gx;
              StoreVec(&scratch[j * kPb + v * W], gx);
            }
            if (db != nullptr) {
              Acc total = 0;
              for (int64_t l = 0; l < W; ++l) total += sum[l];
              db[j0 + j] += total;
            }
          }
          if (g == 0 && b == 0) {
            ItemGradientRows<Acc, I, true>(pr, d, nr, pb, scratch.data(), de + j0 * dp,
                                           partial.data());
          } else {
            ItemGradientRows<Acc, I, false>(pr, d, nr, pb, scratch.data(), de + j0 * dp,
                                            partial.data());
          }
          GemmAcc<Acc, I, false, true>(dm, kPb, nr, er, dp, scratch.data(), kPb,
                                       sh.ds + pb * dm * kPb, kPb);
        }
      }
      if constexpr (kBf16) {
        // dE rows of the tile (+)= G·S over the group's positions (S unscaled).
        if (g == 0) {
          GemmBf16Packed<true>(nr, dp, nq * half, gp.data(), ldg, sh.sap + pb0 * half * dp, dp,
                               de + j0 * dp, dp);
        } else {
          GemmBf16Packed<false>(nr, dp, nq * half, gp.data(), ldg, sh.sap + pb0 * half * dp, dp,
                                de + j0 * dp, dp);
        }
      } else if (g == 0) {  // dE's last columns: the group's sums
        TailToRows<Acc, true>(pr, d, nr, de + j0 * dp, partial.data());
      } else {
        TailToRows<Acc, false>(pr, d, nr, de + j0 * dp, partial.data());
      }
    }
    // The extra logits' gradients: the stored exp(z - m) of their tile, scaled as G.
    for (int64_t b = 0; b < nq; ++b) {
      const int64_t a0 = (pb0 + b) * kPb, a1 = std::min(a0 + kPb, pr.Pa);
      for (int64_t a = a0; a < a1; ++a) {
        const Acc c = sh.c[a];
        for (int64_t x = pr.ex_start[a]; x < pr.ex_start[a + 1]; ++x) {
          const int64_t j = pr.ex_item[x], t = j / kTileRows;
          const Acc stored = panel[((t * q + b) * kTileRows + j % kTileRows) * kPb + (a - a0)];
          sh.dextra[x] =
              c == Acc(0) ? Acc(0)
                          : stored * c * std::exp(mt[(b * tiles + t) * kPb + (a - a0)] - sh.lse[a]);
        }
      }
    }
  }
}

// The backward's coefficients for the upstream gradients dloss and dlse ([P]; nullptr: 1 and
// 0, the forward-with-gradients' unit upstream): per active position c (the softmax's; [Pad],
// 0 on padding), the one-hot term's and the uniform (label smoothing) term's; that term's dE
// row, the same for every item, and dbias; the active positions sorted by target.
template <typename Acc>
struct Coefficients {
  std::vector<Acc> c, onehot, uni, uniform_de;
  Acc uniform_db = 0;
  std::vector<int64_t> by_target;
};

template <typename Acc>
Coefficients<Acc> MakeCoefficients(const Prepared<Acc>& pr, int64_t N, int64_t d, Acc eps,
                                   const Acc* dloss, const Acc* dlse) {
  Coefficients<Acc> co;
  co.c.assign(pr.Pad, Acc(0));
  co.onehot.resize(pr.Pa);
  co.uni.resize(pr.Pa);
  for (int64_t a = 0; a < pr.Pa; ++a) {
    const int64_t p = pr.rows[a];
    const Acc gw = dloss == nullptr ? pr.w[a] : dloss[p] * pr.w[a];
    co.c[a] = dlse == nullptr ? gw : gw + dlse[p];
    co.onehot[a] = gw * (Acc(1) - eps);
    co.uni[a] = gw * eps / static_cast<Acc>(N);
  }
  if (eps != Acc(0)) {
    co.uniform_de.assign(d, Acc(0));
    for (int64_t a = 0; a < pr.Pa; ++a) {
      co.uniform_db += co.uni[a];
      for (int64_t k = 0; k < d; ++k) co.uniform_de[k] += co.uni[a] * pr.sa[a * pr.dp + k];
    }
  }
  co.by_target.resize(pr.Pa);
  std::iota(co.by_target.begin(), co.by_target.end(), 0);
  std::stable_sort(co.by_target.begin(), co.by_target.end(),
                   [&](int64_t x, int64_t z) { return pr.y[x] < pr.y[z]; });
  return co;
}

}  // namespace

template <typename T, typename Acc>
void FlceForward(tensorflow::OpKernelContext* ctx, const FlceInputs<T>& in, Acc* loss, Acc* lse) {
  std::fill(loss, loss + in.P, Acc(0));
  std::fill(lse, lse + in.P, Acc(0));
  if (in.P == 0) return;
  const Prepared<Acc> pr = Prepare<T, Acc>(ctx, in);
  if (pr.Pa == 0) return;
  const int64_t blocks = (in.N + kNb - 1) / kNb;
  const int64_t lanes = std::max<int64_t>(1, std::min<int64_t>(NumThreads(ctx), blocks));
  std::vector<Acc> m(lanes * pr.Pad), s(lanes * pr.Pad);
  ParallelFor(ctx, lanes, int64_t{1} << 30, [&](int64_t l0, int64_t l1) {
    for (int64_t l = l0; l < l1; ++l) {
      Acc* ml = m.data() + l * pr.Pad;
      Acc* sl = s.data() + l * pr.Pad;
      RECOPS_WITH_ISA((ForwardLane<T, Acc, I>(in, pr, l, lanes, ml, sl)));
    }
  });
  const Acc eps = static_cast<Acc>(in.label_smoothing);
  for (int64_t a = 0; a < pr.Pa; ++a) {
    Acc top = -std::numeric_limits<Acc>::infinity();
    for (int64_t l = 0; l < lanes; ++l) top = std::max(top, m[l * pr.Pad + a]);
    Acc value;
    if (top == -std::numeric_limits<Acc>::infinity() || std::isnan(top)) {
      value = top;
      for (int64_t l = 0; l < lanes; ++l) {
        if (std::isnan(m[l * pr.Pad + a]) || std::isnan(s[l * pr.Pad + a])) value = NAN;
      }
    } else {
      Acc sum = 0;
      for (int64_t l = 0; l < lanes; ++l) {
        const Acc ml = m[l * pr.Pad + a];
        if (ml == -std::numeric_limits<Acc>::infinity()) continue;
        sum += s[l * pr.Pad + a] * std::exp(ml - top);
      }
      value = top + std::log(sum);
    }
    const int64_t p = pr.rows[a];
    lse[p] = value;
    Acc ce = value - pr.zy[a];
    if (eps != Acc(0)) ce = (Acc(1) - eps) * ce + eps * (value - pr.zmean[a]);
    loss[p] = pr.w[a] * ce;
  }
}

template <typename T, typename Acc, typename O>
void FlceBackward(tensorflow::OpKernelContext* ctx, const FlceInputs<T>& in, const Acc* dloss,
                  const Acc* dlse, const Acc* lse, O* dstates, O* ditems, O* dbias,
                  O* dextra_values) {
  const int64_t P = in.P, N = in.N, d = in.d;
  const int64_t K = static_cast<int64_t>(in.extra_positions.size());
  std::fill(dstates, dstates + P * d, FromAcc<O, Acc>(Acc(0)));
  std::fill(dextra_values, dextra_values + K, FromAcc<O, Acc>(Acc(0)));
  const Prepared<Acc> pr = Prepare<T, Acc>(ctx, in);
  const Acc eps = static_cast<Acc>(in.label_smoothing);
  const Acc inv_tau = Acc(1) / static_cast<Acc>(in.temperature);
  const Coefficients<Acc> co = MakeCoefficients(pr, N, d, eps, dloss, dlse);
  const std::vector<Acc>& c = co.c;
  const std::vector<Acc>& onehot = co.onehot;
  const std::vector<Acc>& uni = co.uni;
  std::vector<Acc> lse_a(pr.Pad, Acc(0));
  for (int64_t a = 0; a < pr.Pa; ++a) lse_a[a] = lse[pr.rows[a]];
  std::vector<Acc> dextra(pr.ex_item.size(), Acc(0));
  const int64_t blocks = (N + kNb - 1) / kNb;
  const int64_t lanes =
      pr.Pa == 0 ? 1 : std::max<int64_t>(1, std::min<int64_t>(NumThreads(ctx), blocks));
  // The lanes' dS, transposed blocks [blocks x dm x kPb]: d rows on the float GEMM, dp on the
  // bfloat16 one (its tiles' 16).
  const bool bf16 = UseBf16Gemm<T>();
  const int64_t dm = bf16 ? pr.dp : d;
  const int64_t ds_size = pr.blocks * dm * kPb;
  std::vector<Acc> ds(pr.Pa == 0 ? 0 : lanes * ds_size, Acc(0));
  if (pr.Pa == 0) {
    std::fill(ditems, ditems + N * d, FromAcc<O, Acc>(Acc(0)));
    if (dbias != nullptr) std::fill(dbias, dbias + N, FromAcc<O, Acc>(Acc(0)));
    return;
  }
  // The targets' item rows as the logits see them, read before the lanes: ditems may be
  // items' own buffer (the op forwards it when nothing else holds it), each lane writing a
  // block's gradient over its rows once it has read them for the last time.
  std::vector<Acc> target_rows(pr.Pa * d);
  for (int64_t a = 0; a < pr.Pa; ++a) {
    for (int64_t k = 0; k < d; ++k) target_rows[a * d + k] = ItemValue(in, pr, pr.y[a], k);
  }
  // bfloat16 dot products: S's pairs along positions, dE's B operand, shared by the lanes.
  std::vector<uint32_t> sap;
  if constexpr (std::is_same_v<Acc, float>) {
    if (bf16) sap = StatePairs(pr);
  }
  ParallelFor(ctx, lanes, int64_t{1} << 30, [&](int64_t l0, int64_t l1) {
    for (int64_t l = l0; l < l1; ++l) {
      Acc* dsl = ds.data() + l * ds_size;
      if constexpr (std::is_same_v<T, Eigen::bfloat16>) {
        if (bf16) {
          RECOPS_WITH_ISA((BackwardLaneBf16<I, O>(in, pr, c, lse_a, onehot, co.uniform_de,
                                                  co.uniform_db, co.by_target, l, lanes, sap.data(),
                                                  dsl, ditems, dbias, dextra.data())));
          continue;
        }
      }
      RECOPS_WITH_ISA(
          (BackwardLane<T, Acc, I, O>(in, pr, c, lse_a, onehot, co.uniform_de, co.uniform_db,
                                      co.by_target, l, lanes, dsl, ditems, dbias, dextra.data())));
    }
  });
  // dS: the lanes' sums, the one-hot and uniform terms, the temperature.
  ParallelFor(ctx, pr.Pa, (lanes + 2) * d * 4, [&](int64_t a0, int64_t a1) {
    for (int64_t a = a0; a < a1; ++a) {
      O* out = dstates + pr.rows[a] * d;
      for (int64_t k = 0; k < d; ++k) {
        Acc g = 0;
        const int64_t at = ((a / kPb) * dm + k) * kPb + a % kPb;
        for (int64_t l = 0; l < lanes; ++l) g += ds[l * ds_size + at];
        g -= onehot[a] * target_rows[a * d + k];
        if (eps != Acc(0)) g -= uni[a] * pr.colsum[k];
        out[k] = FromAcc<O, Acc>(g * inv_tau);
      }
    }
  });
  for (int64_t a = 0; a < pr.Pa; ++a) {
    for (int64_t x = pr.ex_start[a]; x < pr.ex_start[a + 1]; ++x) {
      Acc g = dextra[x] - uni[a];
      if (pr.ex_item[x] == pr.y[a]) g -= onehot[a];
      dextra_values[pr.ex_index[x]] = FromAcc<O, Acc>(g);
    }
  }
}

template <typename T, typename Acc>
void FlceForwardBackward(tensorflow::OpKernelContext* ctx, const FlceInputs<T>& in, Acc* loss,
                         Acc* lse, Acc* dstates, Acc* ditems, Acc* dbias, Acc* dextra_values) {
  const int64_t P = in.P, N = in.N, d = in.d;
  const int64_t dp = (d + 15) / 16 * 16;
  const int64_t lanes_max = std::max<int64_t>(1, NumThreads(ctx));
  // The panels: per lane [N x (kPb q + dp)], and [N x dp] item rows (as many words of their
  // bfloat16 pairs for bfloat16 inputs).
  const bool bf16 = UseBf16Gemm<T>();
  const auto panel_bytes = [&](int64_t lanes, int64_t q) {
    return static_cast<int64_t>(sizeof(Acc)) * N * ((kPb * q + dp) * lanes + dp);
  };
  // On the float GEMM (T = Acc) and on bfloat16 dot products; bfloat16 inputs without them,
  // catalogues past PanelMaxItems<T>() and those whose panels would pass the budget take the
  // forward and then the backward.
  if ((!std::is_same_v<T, Acc> && !bf16) || P == 0 || N > PanelMaxItems<T>() ||
      panel_bytes(lanes_max, 1) > PanelBudget()) {
    FlceForward<T, Acc>(ctx, in, loss, lse);
    const std::vector<Acc> ones(P, Acc(1)), zeros(P, Acc(0));
    FlceBackward<T, Acc, Acc>(ctx, in, ones.data(), zeros.data(), lse, dstates, ditems, dbias,
                              dextra_values);
    return;
  }
  const int64_t K = static_cast<int64_t>(in.extra_positions.size());
  std::fill(loss, loss + P, Acc(0));
  std::fill(lse, lse + P, Acc(0));
  std::fill(dstates, dstates + P * d, Acc(0));
  std::fill(dextra_values, dextra_values + K, Acc(0));
  const Prepared<Acc> pr = Prepare<T, Acc>(ctx, in);
  if (pr.Pa == 0) {
    std::fill(ditems, ditems + N * d, Acc(0));
    if (dbias != nullptr) std::fill(dbias, dbias + N, Acc(0));
    return;
  }
  const Acc eps = static_cast<Acc>(in.label_smoothing);
  const Acc inv_tau = Acc(1) / static_cast<Acc>(in.temperature);
  // The backward's coefficients for dloss = 1, dlse = 0.
  Coefficients<Acc> co = MakeCoefficients<Acc>(pr, N, d, eps, nullptr, nullptr);
  const std::vector<Acc>& onehot = co.onehot;
  const std::vector<Acc>& uni = co.uni;
  PanelShared<Acc> sh;
  sh.c = std::move(co.c);
  std::vector<Acc> lse_a(pr.Pad, Acc(0));
  // The lanes' buffers from TensorFlow's allocator (reused from step to step: fresh pages
  // would be faulted in and zeroed at every call, 5-10% of the op at 12,000 items).
  const int64_t lanes = std::min<int64_t>(lanes_max, pr.blocks);
  // Blocks of positions per group: up to kPanelGroup, no more than leaves every lane a group,
  // and within the budget.
  int64_t q = std::max<int64_t>(1, std::min<int64_t>(kPanelGroup, pr.blocks / lanes));
  while (q > 1 && panel_bytes(lanes, q) > PanelBudget()) --q;
  const int64_t tiles = (N + kTileRows - 1) / kTileRows;
  // bfloat16 dot products: the tiles' operands as bfloat16 pairs, once for every lane (the
  // items' pairs along d, then each tile's Eᵀ pairs across items), in place of float rows.
  const int64_t dph = dp / 2, nh_max = kTileRows / 2;
  const int64_t pack_words = bf16 ? N * dph + tiles * dp * nh_max : 0;
  tensorflow::Tensor items_t, packs_t, panels_t, de_t;
  const tensorflow::DataType type = tensorflow::DataTypeToEnum<Acc>::v();
  for (auto [t, n] :
       {std::pair{&items_t, bf16 ? int64_t{0} : N * dp}, std::pair{&packs_t, pack_words},
        std::pair{&panels_t, lanes * q * tiles * kTileRows * kPb},
        std::pair{&de_t, lanes * N * dp}}) {
    const absl::Status status = ctx->allocate_temp(type, tensorflow::TensorShape({n}), t);
    if (!status.ok()) {
      ctx->SetStatus(status);
      return;
    }
  }
  // The float GEMM: the item rows once, dp apart (normalised where asked), for every lane.
  Acc* items = items_t.flat<Acc>().data();
  if (!bf16) {
    ParallelFor(ctx, N, 4 * d + 8, [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) {
        for (int64_t k = 0; k < d; ++k) items[j * dp + k] = ItemValue(in, pr, j, k);
        for (int64_t k = d; k < dp; ++k) items[j * dp + k] = Acc(0);
      }
    });
  }
  sh.items = items;
  std::vector<uint32_t> stp, sap;
  if constexpr (std::is_same_v<Acc, float>) {
    if (bf16) {
      uint32_t* ep = reinterpret_cast<uint32_t*>(packs_t.flat<Acc>().data());
      uint32_t* etp = ep + N * dph;
      // Per tile, its rows' bfloat16 bits as the logits see them (ItemValue; zero past d and
      // N), made once: the pairs along d are those rows as they lie, the pairs across items two
      // rows interleaved. (Made value by value for each pair, this took 1.1 ms of the op's
      // 15.5 at 2,100 x 12,000 x 50; the whole setup now 0.55.)
      ParallelFor(ctx, tiles, kTileRows * dp * 4, [&](int64_t t0, int64_t t1) {
        std::vector<uint16_t> bits(kTileRows * dp);
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t j0 = t * kTileRows, nr = std::min(kTileRows, N - j0);
          std::fill(bits.begin(), bits.end(), uint16_t{0});
          for (int64_t j = 0; j < nr; ++j) {
            uint16_t* row = bits.data() + j * dp;
            if (pr.inv_norm.empty()) {
              std::memcpy(row, in.items + (j0 + j) * d, d * sizeof(uint16_t));
            } else {
              for (int64_t k = 0; k < d; ++k) {
                const float x = ItemValue(in, pr, j0 + j, k);
                uint32_t u;
                std::memcpy(&u, &x, 4);
                row[k] = static_cast<uint16_t>(u >> 16);
              }
            }
          }
          std::memcpy(ep + j0 * dph, bits.data(), nr * dp * sizeof(uint16_t));
          for (int64_t k = 0; k < dp; ++k) {
            uint32_t* out = etp + (t * dp + k) * nh_max;
            for (int64_t jj = 0; jj < nh_max; ++jj)
              out[jj] = bits[2 * jj * dp + k] | uint32_t{bits[(2 * jj + 1) * dp + k]} << 16;
          }
        }
      });
      sh.ep = ep;
      sh.etp = etp;
      stp.resize(pr.blocks * dph * kPb);
      for (int64_t pb = 0; pb < pr.blocks; ++pb) {
        const Acc* st = pr.st.data() + pb * dp * kPb;
        for (int64_t kk = 0; kk < dph; ++kk) {
          for (int64_t n = 0; n < kPb; ++n)
            stp[(pb * dph + kk) * kPb + n] =
                PairOf(st[2 * kk * kPb + n], st[(2 * kk + 1) * kPb + n]);
        }
      }
      sap = StatePairs(pr);
      sh.stp = stp.data();
      sh.sap = sap.data();
    }
  }
  // dSᵀ's rows: d on the float GEMM, dp on the bfloat16 one (its tiles' 16).
  const int64_t dm = bf16 ? dp : d;
  std::vector<Acc> ds(pr.blocks * dm * kPb, Acc(0)), dextra(pr.ex_item.size(), Acc(0));
  sh.lse = lse_a.data();
  sh.ds = ds.data();
  sh.dextra = dextra.data();
  Acc* panels = panels_t.flat<Acc>().data();
  Acc* de = de_t.flat<Acc>().data();
  std::vector<Acc> db(dbias == nullptr ? 0 : lanes * N);
  ParallelFor(ctx, lanes, int64_t{1} << 30, [&](int64_t l0, int64_t l1) {
    for (int64_t l = l0; l < l1; ++l) {
      RECOPS_WITH_ISA(
          (PanelLane<T, Acc, I>(in, pr, sh, l, lanes, q, panels + l * q * tiles * kTileRows * kPb,
                                de + l * N * dp, db.empty() ? nullptr : db.data() + l * N)));
    }
  });
  // dE and dbias: the lanes' sums (lane order), then each block's one-hot, smoothing and
  // temperature terms.
  const int64_t blocks = (N + kNb - 1) / kNb;
  ParallelFor(ctx, blocks, kNb * dp * (lanes + 4), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t j0 = b * kNb, nb = std::min(kNb, N - j0);
      Acc* out = de + j0 * dp;
      for (int64_t l = 1; l < lanes; ++l) {
        const Acc* part = de + l * N * dp + j0 * dp;
        for (int64_t j = 0; j < nb; ++j) {  // columns past d: unwritten where pr.dcut < d
          for (int64_t k = 0; k < d; ++k) out[j * dp + k] += part[j * dp + k];
        }
      }
      Acc* dbo = db.empty() ? nullptr : db.data() + j0;
      for (int64_t l = 1; l < lanes && dbo != nullptr; ++l) {
        for (int64_t j = 0; j < nb; ++j) dbo[j] += db[l * N + j0 + j];
      }
      std::vector<Acc> db_none;
      if (dbo == nullptr) {
        db_none.assign(nb, Acc(0));
        dbo = db_none.data();
      }
      FinishItemBlock(in, pr, onehot, co.uniform_de, co.uniform_db, co.by_target, j0, nb, out, dbo,
                      ditems, dbias);
    }
  });
  // dS: the one-hot and uniform terms, the temperature; the loss from lse.
  ParallelFor(ctx, pr.Pa, 4 * d + 8, [&](int64_t a0, int64_t a1) {
    for (int64_t a = a0; a < a1; ++a) {
      Acc* out = dstates + pr.rows[a] * d;
      const int64_t y = pr.y[a];
      for (int64_t k = 0; k < d; ++k) {
        Acc g = ds[((a / kPb) * dm + k) * kPb + a % kPb];
        g -= onehot[a] * ItemValue(in, pr, y, k);
        if (eps != Acc(0)) g -= uni[a] * pr.colsum[k];
        out[k] = g * inv_tau;
      }
    }
  });
  for (int64_t a = 0; a < pr.Pa; ++a) {
    const int64_t p = pr.rows[a];
    const Acc value = lse_a[a];
    lse[p] = value;
    Acc ce = value - pr.zy[a];
    if (eps != Acc(0)) ce = (Acc(1) - eps) * ce + eps * (value - pr.zmean[a]);
    loss[p] = pr.w[a] * ce;
    for (int64_t x = pr.ex_start[a]; x < pr.ex_start[a + 1]; ++x) {
      Acc g = dextra[x] - uni[a];
      if (pr.ex_item[x] == pr.y[a]) g -= onehot[a];
      dextra_values[pr.ex_index[x]] = g;
    }
  }
}

#define RECOPS_FLCE_INSTANTIATE_(T, Acc)                                                        \
  template void FlceForward<T, Acc>(tensorflow::OpKernelContext*, const FlceInputs<T>&, Acc*,   \
                                    Acc*);                                                      \
  template void FlceBackward<T, Acc, T>(tensorflow::OpKernelContext*, const FlceInputs<T>&,     \
                                        const Acc*, const Acc*, const Acc*, T*, T*, T*, T*);    \
  template void FlceForwardBackward<T, Acc>(tensorflow::OpKernelContext*, const FlceInputs<T>&, \
                                            Acc*, Acc*, Acc*, Acc*, Acc*, Acc*);
RECOPS_FLCE_INSTANTIATE_(float, float)
RECOPS_FLCE_INSTANTIATE_(Eigen::bfloat16, float)
RECOPS_FLCE_INSTANTIATE_(double, double)
#undef RECOPS_FLCE_INSTANTIATE_
// bfloat16 inputs' backward into float (FlceForwardBackward's fallback: its unit gradients
// are float, rounded to bfloat16 once, by FusedLinearCrossEntropyApplyGrad, after the scale).
template void FlceBackward<Eigen::bfloat16, float, float>(tensorflow::OpKernelContext*,
                                                          const FlceInputs<Eigen::bfloat16>&,
                                                          const float*, const float*, const float*,
                                                          float*, float*, float*, float*);

}  // namespace recops
