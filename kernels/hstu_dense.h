// HSTU attention (stem hstu_dense): the problem description, the visibility (mask) rules of
// spec §1 and the tiled forward / backward work items.
//
// Scores are never materialised beyond one kTileQ x kTileK tile: a work item owns a block of
// query rows (forward, dQ) or of key rows (dK, dV), recomputes the scores of each visible tile
// with a register-blocked GEMM, applies bias / alpha / SiLU / scale / mask on the tile and
// multiplies into V (or accumulates gradients). Accumulation is in Acc (float for float16,
// bfloat16 and float32; double for float64); values are rounded to the input dtype exactly
// where the spec's kernels round (scores, P, dO·Vᵀ, dS).
#ifndef RECOPS_KERNELS_HSTU_DENSE_H_
#define RECOPS_KERNELS_HSTU_DENSE_H_

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/common/dtypes.h"
#include "kernels/common/microkernels.h"

namespace recops {

constexpr int64_t kTileQ = 64;
constexpr int64_t kTileK = 64;

enum class HstuMask : int { kCausal = 0, kNone = 2, kCustom = 3 };

struct HstuProblem {
  int64_t batch = 0, heads_q = 0, heads_k = 0, dim_qk = 0, dim_v = 0;
  int64_t max_q = 0, max_k = 0;  // max_seq_len, max_seq_len_k: the bias / mask plane extents
  const int64_t* off_q = nullptr;
  const int64_t* off_k = nullptr;
  const int64_t* num_context = nullptr;  // [batch] or nullptr (zeros)
  const int64_t* num_target = nullptr;   // [batch] or nullptr (zeros)
  int64_t group = 0;                     // target_group_size
  HstuMask mask_type = HstuMask::kCausal;
  int64_t window_left = -1, window_right = -1;  // -1: unbounded
  double alpha = 1.0, scale = 1.0;              // scale: silu_scale, already resolved
  bool has_bias = false;
};

struct HstuSeq {
  int64_t lq, lk, delta, ctx, tgt;
};

inline HstuSeq SeqOf(const HstuProblem& p, int64_t b) {
  HstuSeq s;
  s.lq = p.off_q[b + 1] - p.off_q[b];
  s.lk = p.off_k[b + 1] - p.off_k[b];
  s.delta = s.lk - s.lq;
  s.ctx = p.num_context ? p.num_context[b] : 0;
  s.tgt = p.num_target ? p.num_target[b] : 0;
  return s;
}

// Whether query i may see key j (before a custom mask's value multiplies), spec §1 and §6.
RECOPS_INLINE bool HstuVisible(const HstuProblem& p, const HstuSeq& s, int64_t i, int64_t j) {
  bool vis = true;
  if (p.mask_type == HstuMask::kCausal) {
    if (s.ctx > 0 && i < s.ctx) {
      vis = j < s.lk - s.tgt;  // context rows see context + history, not the targets
    } else {
      vis = j <= i + s.delta;
    }
    if (p.group > 0 && s.tgt > 0 && i >= s.lq - s.tgt && j >= s.lk - s.tgt) {
      const int64_t ti = i - (s.lq - s.tgt), tj = j - (s.lk - s.tgt);
      vis = ti / p.group == tj / p.group && tj <= ti;
    }
  }
  if (p.window_left >= 0 && j < i + s.delta - p.window_left) vis = false;
  if (p.window_right >= 0 && j > i + s.delta + p.window_right) vis = false;
  return vis;
}

// True if row i's visibility over columns below j_end is just the causal / window interval
// (no context-row or target-group rule applies to it).
RECOPS_INLINE bool HstuPlainRow(const HstuProblem& p, const HstuSeq& s, int64_t i,
                                int64_t j_end) {
  if (p.mask_type != HstuMask::kCausal) return true;
  if (s.ctx > 0 && i < s.ctx) return false;
  if (p.group > 0 && s.tgt > 0 && i >= s.lq - s.tgt && j_end > s.lk - s.tgt) return false;
  return true;
}

// Conservative: false only if no (i, j) of the tile can be visible.
inline bool HstuTileMaybeVisible(const HstuProblem& p, const HstuSeq& s, int64_t i0, int64_t i1,
                                 int64_t j0, int64_t j1) {
  const int64_t last_i = i1 - 1, last_j = j1 - 1;
  if (p.window_left >= 0 && last_j < i0 + s.delta - p.window_left) return false;
  if (p.window_right >= 0 && j0 > last_i + s.delta + p.window_right) return false;
  if (p.mask_type == HstuMask::kCausal) {
    const bool has_context_rows = s.ctx > 0 && i0 < s.ctx;
    if (!has_context_rows && j0 > last_i + s.delta) return false;
  }
  return true;
}

// True if every (i, j) of the tile is visible (the mask can then be skipped).
inline bool HstuTileFullyVisible(const HstuProblem& p, const HstuSeq& s, int64_t i0, int64_t i1,
                                 int64_t j0, int64_t j1) {
  const int64_t last_i = i1 - 1, last_j = j1 - 1;
  if (p.window_left >= 0 && j0 < last_i + s.delta - p.window_left) return false;
  if (p.window_right >= 0 && last_j > i0 + s.delta + p.window_right) return false;
  if (p.mask_type == HstuMask::kCausal) {
    if (s.ctx > 0 && i0 < s.ctx) return false;
    if (p.group > 0 && s.tgt > 0 && last_i >= s.lq - s.tgt && last_j >= s.lk - s.tgt) {
      return false;
    }
    if (last_j > i0 + s.delta) return false;
  }
  return true;
}

template <typename T>
struct HstuTensors {
  const T* q = nullptr;
  const T* k = nullptr;
  const T* v = nullptr;
  const T* mask = nullptr;  // custom mask [B, Nq, max_q, max_k]
  const T* bias = nullptr;  // [B, Nq, max_q, max_k]
  const T* grad = nullptr;  // dO [Tq, Nq, Dv]
  T* out = nullptr;
  T* dq = nullptr;
  T* dk = nullptr;
  T* dv = nullptr;
  T* dbias = nullptr;
};

// One query block of one (sequence, head) in the work list.
struct HstuItem {
  int64_t b, h, row0;  // h: query head (forward, dQ) or kv head (dK, dV)
  int64_t cost;
};

// Work items (b, head, block start) over blocks of `block` rows of the q side (kv_side =
// false, heads = heads_q) or the k side (kv_side = true, heads = heads_k), with a cost estimate
// (visible tiles), most expensive first.
std::vector<HstuItem> HstuWorkItems(const HstuProblem& p, bool kv_side);

// One item per (sequence, kv head) with a non-empty sequence, most expensive first.
std::vector<HstuItem> HstuSequenceItems(const HstuProblem& p);

// The operands of the tiles in the accumulation type, prepared once per op call (for float32
// inputs q, k, v, dO are the inputs themselves; narrower inputs are converted once, and only
// where a GEMM reads them as vectors): tiles are then strided views, never copies.
template <typename Acc>
struct HstuOperands {
  const Acc* q = nullptr;     // [Tq, Nq, Dqk] (backward; the forward reads the input)
  const Acc* k = nullptr;     // [Tk, Nk, Dqk] (backward)
  const Acc* v = nullptr;     // [Tk, Nk, Dv] (forward)
  // K and V transposed in key tiles: [Nk, num_tiles, dim, kTileK], tile t of sequence b
  // holding its keys [64 t', 64 t' + 64) with t = tile_base[b] + t'. A tile's Kᵀ is then one
  // contiguous [dim x 64] block (ld 64) instead of 64 rows strided by the whole key count.
  const Acc* kt = nullptr;
  const Acc* vt = nullptr;  // (backward)
  const Acc* dout = nullptr;  // [Tq, Nq, Dv] (backward)
  const int64_t* tile_base = nullptr;  // [B]
  int64_t num_tiles = 0;
};

template <typename Acc>
struct HstuScratch {
  HstuScratch()
      : s(kTileQ * kTileK), dp(kTileQ * kTileK), pt(kTileK * kTileQ), dst(kTileK * kTileQ),
        z(kTileK), m(kTileK) {}
  std::vector<Acc> s, dp, pt, dst, z, m;
};

// Mask factors (scale · mask value · visibility) for row i of a tile, columns j0..j0+nk.
template <typename T, typename Acc>
RECOPS_INLINE void MaskRow(const HstuProblem& p, const HstuTensors<T>& t, const HstuSeq& s,
                           int64_t b, int64_t h, int64_t i, int64_t j0, int64_t nk, bool full,
                           Acc* m) {
  const Acc scale = static_cast<Acc>(p.scale);
  const T* mask_row = p.mask_type == HstuMask::kCustom
                          ? t.mask + ((b * p.heads_q + h) * p.max_q + i) * p.max_k + j0
                          : nullptr;
  if (full) {
    for (int64_t c = 0; c < nk; ++c) m[c] = scale;
  } else if (HstuPlainRow(p, s, i, j0 + nk)) {
    // Visible columns form one interval [lo, hi] (causal and window bounds only).
    int64_t lo = 0, hi = nk - 1;
    if (p.mask_type == HstuMask::kCausal) hi = std::min(hi, i + s.delta - j0);
    if (p.window_left >= 0) lo = std::max(lo, i + s.delta - p.window_left - j0);
    if (p.window_right >= 0) hi = std::min(hi, i + s.delta + p.window_right - j0);
    for (int64_t c = 0; c < nk; ++c) m[c] = c >= lo && c <= hi ? scale : Acc(0);
  } else {
    for (int64_t c = 0; c < nk; ++c) m[c] = HstuVisible(p, s, i, j0 + c) ? scale : Acc(0);
  }
  if (mask_row) {
    for (int64_t c = 0; c < nk; ++c) m[c] *= ToAcc<T, Acc>(mask_row[c]);
  }
}

// Scores of one tile -> P (in place in `sc`), and with `dp` given, dS (in place in `dp`,
// which holds dO·Vᵀ on entry). Rounding to T where the spec's kernels round.
template <typename T, typename Acc>
RECOPS_INLINE void ScoreTile(const HstuProblem& p, const HstuTensors<T>& t, const HstuSeq& s,
                             int64_t b, int64_t h, int64_t i0, int64_t mq, int64_t j0,
                             int64_t nk, Acc* sc, Acc* dp, Acc* z, Acc* m) {
  const bool full = HstuTileFullyVisible(p, s, i0, i0 + mq, j0, j0 + nk);
  const Acc alpha = static_cast<Acc>(p.alpha);
  for (int64_t r = 0; r < mq; ++r) {
    const int64_t i = i0 + r;
    Acc* srow = sc + r * kTileK;
    MaskRow<T, Acc>(p, t, s, b, h, i, j0, nk, full, m);
    if (p.has_bias) {
      const T* bias_row = t.bias + ((b * p.heads_q + h) * p.max_q + i) * p.max_k + j0;
      for (int64_t c = 0; c < nk; ++c) {
        z[c] = alpha * (RoundTo<T, Acc>(srow[c]) + ToAcc<T, Acc>(bias_row[c]));
      }
    } else {
      for (int64_t c = 0; c < nk; ++c) z[c] = alpha * RoundTo<T, Acc>(srow[c]);
    }
    if (dp == nullptr) {
      for (int64_t c = 0; c < nk; ++c) srow[c] = RoundTo<T, Acc>(z[c] * Sigmoid(z[c]) * m[c]);
    } else {
      Acc* dprow = dp + r * kTileK;
      for (int64_t c = 0; c < nk; ++c) {
        const Acc sig = Sigmoid(z[c]);
        srow[c] = RoundTo<T, Acc>(z[c] * sig * m[c]);
        const Acc dsilu = sig * (Acc(1) + z[c] * (Acc(1) - sig));
        dprow[c] = RoundTo<T, Acc>(alpha * m[c] * dsilu * RoundTo<T, Acc>(dprow[c]));
      }
    }
  }
}

// Transposes the [rows x cols] tile (ld kTileK) into [cols x rows] (ld kTileQ).
template <typename Acc>
RECOPS_INLINE void TransposeTile(const Acc* src, int64_t rows, int64_t cols, Acc* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[c * kTileQ + r] = src[r * kTileK + c];
  }
}

// S tile = the query rows at q_rows (row stride lda; the input dtype or Acc) times Kᵀ columns
// of key tile k_tile of kv head kv.
template <typename Acc, int R, typename TQ>
RECOPS_INLINE void ScoresQK(const HstuProblem& p, const HstuOperands<Acc>& a, const TQ* q_rows,
                            int64_t lda, int64_t mq, int64_t k_tile, int64_t kv, int64_t nk,
                            Acc* s) {
  std::fill(s, s + kTileQ * kTileK, Acc(0));
  GemmAcc<Acc, R, TQ>(mq, nk, p.dim_qk, q_rows, lda,
                      a.kt + (kv * a.num_tiles + k_tile) * p.dim_qk * kTileK, kTileK, s, kTileK);
}

// dP tile = dO rows of head h times Vᵀ columns of kv head kv.
template <typename Acc, int R>
RECOPS_INLINE void ScoresDoV(const HstuProblem& p, const HstuOperands<Acc>& a, int64_t q_row,
                             int64_t h, int64_t mq, int64_t k_tile, int64_t kv, int64_t nk,
                             Acc* dp) {
  std::fill(dp, dp + kTileQ * kTileK, Acc(0));
  GemmAcc<Acc, R>(mq, nk, p.dim_v, a.dout + (q_row * p.heads_q + h) * p.dim_v,
                  p.heads_q * p.dim_v, a.vt + (kv * a.num_tiles + k_tile) * p.dim_v * kTileK,
                  kTileK, dp, kTileK);
}

// Writes n rows of an Acc [n x dim] block to rows r0.. of head `head` of a [rows, heads, dim]
// output.
template <typename T, typename Acc>
RECOPS_INLINE void StoreRows(const Acc* block, int64_t n, int64_t dim, T* out, int64_t heads,
                             int64_t head, int64_t r0) {
  for (int64_t r = 0; r < n; ++r) {
    T* dst = out + ((r0 + r) * heads + head) * dim;
    for (int64_t d = 0; d < dim; ++d) dst[d] = FromAcc<T, Acc>(block[r * dim + d]);
  }
}

// Forward: output rows [row0, row0 + kTileQ) of query head h of sequence b.
template <typename T, typename Acc, int R>
RECOPS_INLINE void HstuForwardItem(const HstuProblem& p, const HstuTensors<T>& t,
                                   const HstuOperands<Acc>& a, const HstuItem& item) {
  const HstuSeq s = SeqOf(p, item.b);
  const int64_t h = item.h, kv = h / (p.heads_q / p.heads_k);
  const int64_t i0 = item.row0, mq = std::min(kTileQ, s.lq - i0);
  const int64_t oq = p.off_q[item.b], ok = p.off_k[item.b];
  HstuScratch<Acc> w;
  std::vector<Acc> o(mq * p.dim_v, Acc(0));
  // The query block as A operand: float32 / float64 in place; narrower types converted once
  // here rather than at every broadcast of every key tile.
  const T* q_in = t.q + ((oq + i0) * p.heads_q + h) * p.dim_qk;
  std::vector<Acc> q_block(std::is_same_v<T, Acc> ? 0 : mq * p.dim_qk);
  for (int64_t r = 0; r < static_cast<int64_t>(q_block.size()) / std::max<int64_t>(p.dim_qk, 1);
       ++r) {
    for (int64_t d = 0; d < p.dim_qk; ++d) {
      q_block[r * p.dim_qk + d] = ToAcc<T, Acc>(q_in[r * p.heads_q * p.dim_qk + d]);
    }
  }
  for (int64_t j0 = 0; j0 < s.lk; j0 += kTileK) {
    const int64_t nk = std::min(kTileK, s.lk - j0);
    if (!HstuTileMaybeVisible(p, s, i0, i0 + mq, j0, j0 + nk)) continue;
    const int64_t k_tile = a.tile_base[item.b] + j0 / kTileK;
    if constexpr (std::is_same_v<T, Acc>) {
      ScoresQK<Acc, R>(p, a, q_in, p.heads_q * p.dim_qk, mq, k_tile, kv, nk, w.s.data());
    } else {
      ScoresQK<Acc, R>(p, a, q_block.data(), p.dim_qk, mq, k_tile, kv, nk, w.s.data());
    }
    ScoreTile<T, Acc>(p, t, s, item.b, h, i0, mq, j0, nk, w.s.data(), nullptr, w.z.data(),
                      w.m.data());
    if constexpr (std::is_same_v<T, Eigen::bfloat16> || std::is_same_v<T, Acc>) {
      // V read in its own dtype (bfloat16 widens as it loads): no converted copy.
      GemmAcc<Acc, R, Acc, T>(mq, p.dim_v, nk, w.s.data(), kTileK,
                              t.v + ((ok + j0) * p.heads_k + kv) * p.dim_v, p.heads_k * p.dim_v,
                              o.data(), p.dim_v);
    } else {
      GemmAcc<Acc, R>(mq, p.dim_v, nk, w.s.data(), kTileK,
                      a.v + ((ok + j0) * p.heads_k + kv) * p.dim_v, p.heads_k * p.dim_v,
                      o.data(), p.dim_v);
    }
  }
  StoreRows(o.data(), mq, p.dim_v, t.out, p.heads_q, h, oq + i0);
}

// One (query block, key block) tile of the backward: recomputes P and dS, adds the tile's
// dV (Pᵀ·dO) and dK (dSᵀ·Q) into the key block's accumulators; leaves dS in w.dp.
template <typename T, typename Acc, int R>
RECOPS_INLINE void BackwardTileKv(const HstuProblem& p, const HstuTensors<T>& t,
                                  const HstuOperands<Acc>& a, const HstuSeq& s, int64_t b,
                                  int64_t h, int64_t kv, int64_t i0, int64_t mq, int64_t j0,
                                  int64_t nk, HstuScratch<Acc>& w, Acc* dk, Acc* dv) {
  const int64_t oq = p.off_q[b], k_tile = a.tile_base[b] + j0 / kTileK;
  ScoresQK<Acc, R>(p, a, a.q + ((oq + i0) * p.heads_q + h) * p.dim_qk, p.heads_q * p.dim_qk, mq,
                   k_tile, kv, nk, w.s.data());
  ScoresDoV<Acc, R>(p, a, oq + i0, h, mq, k_tile, kv, nk, w.dp.data());
  ScoreTile<T, Acc>(p, t, s, b, h, i0, mq, j0, nk, w.s.data(), w.dp.data(), w.z.data(),
                    w.m.data());
  TransposeTile(w.s.data(), mq, nk, w.pt.data());
  TransposeTile(w.dp.data(), mq, nk, w.dst.data());
  GemmAcc<Acc, R>(nk, p.dim_v, mq, w.pt.data(), kTileQ,
                  a.dout + ((oq + i0) * p.heads_q + h) * p.dim_v, p.heads_q * p.dim_v, dv,
                  p.dim_v);
  GemmAcc<Acc, R>(nk, p.dim_qk, mq, w.dst.data(), kTileQ,
                  a.q + ((oq + i0) * p.heads_q + h) * p.dim_qk, p.heads_q * p.dim_qk, dk,
                  p.dim_qk);
}

// With dS of a tile in w.dp: dQ (of the tile's query rows, ld Dqk) += dS·K, and the bias
// gradient of the tile = dS.
template <typename T, typename Acc, int R>
RECOPS_INLINE void BackwardTileQ(const HstuProblem& p, const HstuTensors<T>& t,
                                 const HstuOperands<Acc>& a, int64_t b, int64_t h, int64_t kv,
                                 int64_t i0, int64_t mq, int64_t j0, int64_t nk,
                                 const HstuScratch<Acc>& w, Acc* dq) {
  GemmAcc<Acc, R>(mq, p.dim_qk, nk, w.dp.data(), kTileK,
                  a.k + ((p.off_k[b] + j0) * p.heads_k + kv) * p.dim_qk, p.heads_k * p.dim_qk,
                  dq, p.dim_qk);
  if (p.has_bias) {
    for (int64_t r = 0; r < mq; ++r) {
      T* row = t.dbias + ((b * p.heads_q + h) * p.max_q + i0 + r) * p.max_k + j0;
      for (int64_t c = 0; c < nk; ++c) row[c] = FromAcc<T, Acc>(w.dp[r * kTileK + c]);
    }
  }
}

// Backward, key side: dK and dV of key rows [row0, row0 + kTileK) of kv head item.h, summed
// over the query heads of its group and all query blocks (no other item writes them).
template <typename T, typename Acc, int R>
RECOPS_INLINE void HstuBackwardKvItem(const HstuProblem& p, const HstuTensors<T>& t,
                                      const HstuOperands<Acc>& a, const HstuItem& item) {
  const HstuSeq s = SeqOf(p, item.b);
  const int64_t kv = item.h, group = p.heads_q / p.heads_k;
  const int64_t j0 = item.row0, nk = std::min(kTileK, s.lk - j0);
  HstuScratch<Acc> w;
  std::vector<Acc> dk(nk * p.dim_qk, Acc(0)), dv(nk * p.dim_v, Acc(0));
  for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
    for (int64_t i0 = 0; i0 < s.lq; i0 += kTileQ) {
      const int64_t mq = std::min(kTileQ, s.lq - i0);
      if (!HstuTileMaybeVisible(p, s, i0, i0 + mq, j0, j0 + nk)) continue;
      BackwardTileKv<T, Acc, R>(p, t, a, s, item.b, h, kv, i0, mq, j0, nk, w, dk.data(),
                                dv.data());
    }
  }
  StoreRows(dk.data(), nk, p.dim_qk, t.dk, p.heads_k, kv, p.off_k[item.b] + j0);
  StoreRows(dv.data(), nk, p.dim_v, t.dv, p.heads_k, kv, p.off_k[item.b] + j0);
}

// Backward, query side: dQ of query rows [row0, row0 + kTileQ) of head item.h, and the bias
// gradient (= dS) of those rows.
template <typename T, typename Acc, int R>
RECOPS_INLINE void HstuBackwardQItem(const HstuProblem& p, const HstuTensors<T>& t,
                                     const HstuOperands<Acc>& a, const HstuItem& item) {
  const HstuSeq s = SeqOf(p, item.b);
  const int64_t h = item.h, kv = h / (p.heads_q / p.heads_k);
  const int64_t i0 = item.row0, mq = std::min(kTileQ, s.lq - i0);
  const int64_t oq = p.off_q[item.b];
  HstuScratch<Acc> w;
  std::vector<Acc> dq(mq * p.dim_qk, Acc(0));
  for (int64_t j0 = 0; j0 < s.lk; j0 += kTileK) {
    const int64_t nk = std::min(kTileK, s.lk - j0);
    if (!HstuTileMaybeVisible(p, s, i0, i0 + mq, j0, j0 + nk)) continue;
    const int64_t k_tile = a.tile_base[item.b] + j0 / kTileK;
    ScoresQK<Acc, R>(p, a, a.q + ((oq + i0) * p.heads_q + h) * p.dim_qk, p.heads_q * p.dim_qk, mq,
                   k_tile, kv, nk, w.s.data());
    ScoresDoV<Acc, R>(p, a, oq + i0, h, mq, k_tile, kv, nk, w.dp.data());
    ScoreTile<T, Acc>(p, t, s, item.b, h, i0, mq, j0, nk, w.s.data(), w.dp.data(), w.z.data(),
                      w.m.data());
    BackwardTileQ<T, Acc, R>(p, t, a, item.b, h, kv, i0, mq, j0, nk, w, dq.data());
  }
  StoreRows(dq.data(), mq, p.dim_qk, t.dq, p.heads_q, h, oq + i0);
}

// Backward in one pass over a whole (sequence, kv head) (used when there are enough of them to
// keep every thread busy): per key block, dK and dV as in HstuBackwardKvItem, and dQ of every
// query block accumulated in a per-item buffer, so each tile's scores are computed once (5
// tile GEMMs instead of 7). The summation orders equal those of the two-pass path (dK, dV:
// query heads then query blocks ascending; dQ: key blocks ascending), so both paths give the
// same bits.
template <typename T, typename Acc, int R>
RECOPS_INLINE void HstuBackwardSeqItem(const HstuProblem& p, const HstuTensors<T>& t,
                                       const HstuOperands<Acc>& a, const HstuItem& item) {
  const HstuSeq s = SeqOf(p, item.b);
  const int64_t kv = item.h, group = p.heads_q / p.heads_k;
  const int64_t oq = p.off_q[item.b], ok = p.off_k[item.b];
  HstuScratch<Acc> w;
  std::vector<Acc> dq(group * s.lq * p.dim_qk, Acc(0));
  std::vector<Acc> dk(kTileK * p.dim_qk), dv(kTileK * p.dim_v);
  for (int64_t j0 = 0; j0 < s.lk; j0 += kTileK) {
    const int64_t nk = std::min(kTileK, s.lk - j0);
    std::fill(dk.begin(), dk.end(), Acc(0));
    std::fill(dv.begin(), dv.end(), Acc(0));
    for (int64_t g = 0; g < group; ++g) {
      const int64_t h = kv * group + g;
      for (int64_t i0 = 0; i0 < s.lq; i0 += kTileQ) {
        const int64_t mq = std::min(kTileQ, s.lq - i0);
        if (!HstuTileMaybeVisible(p, s, i0, i0 + mq, j0, j0 + nk)) continue;
        BackwardTileKv<T, Acc, R>(p, t, a, s, item.b, h, kv, i0, mq, j0, nk, w, dk.data(),
                                  dv.data());
        BackwardTileQ<T, Acc, R>(p, t, a, item.b, h, kv, i0, mq, j0, nk, w,
                                 dq.data() + (g * s.lq + i0) * p.dim_qk);
      }
    }
    StoreRows(dk.data(), nk, p.dim_qk, t.dk, p.heads_k, kv, ok + j0);
    StoreRows(dv.data(), nk, p.dim_v, t.dv, p.heads_k, kv, ok + j0);
  }
  for (int64_t g = 0; g < group; ++g) {
    StoreRows(dq.data() + g * s.lq * p.dim_qk, s.lq, p.dim_qk, t.dq, p.heads_q, kv * group + g,
              oq);
  }
}

}  // namespace recops

#endif  // RECOPS_KERNELS_HSTU_DENSE_H_
