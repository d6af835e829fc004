// HSTU attention (stem hstu_dense): the problem description, the visibility (mask) rules of
// spec §1 and the tiled forward / backward work items.
//
// Scores are never materialised beyond one kTileQ x kTileK tile: a work item owns a chunk of
// 64-row blocks of query rows (forward, dQ) or of key rows (dK, dV), or a whole (sequence, kv
// head) (one-pass backward); it packs the operands it reads into per-thread zero-padded tiles,
// recomputes the scores of each visible tile with a register-blocked GEMM, applies bias /
// alpha / SiLU / scale / mask on the tile and multiplies into V (or accumulates gradients).
// Accumulation is in Acc (float for float16, bfloat16 and float32; double for float64); values are
// rounded to the input dtype exactly where the spec's kernels round (scores, P, dO·Vᵀ, dS).
#ifndef RECOPS_KERNELS_HSTU_DENSE_H_
#define RECOPS_KERNELS_HSTU_DENSE_H_

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/common/copy.h"
#include "kernels/common/dispatch.h"
#include "kernels/common/dtypes.h"
#include "kernels/common/microkernels.h"
#include "kernels/relative_attn_bias.h"

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
  // generative-recommenders' mask rules instead of the Rec SDK's (mask_type kCausal or kNone,
  // self-attention, no context counts / groups / windows): positions get GR's ids (GrId),
  // visibility is GrVisible. gr_window: max_attn_len (0: unbounded); gr_context:
  // contextual_seq_len; gr_full: min_full_attn_seq_len.
  bool gr = false;
  int64_t gr_window = 0, gr_context = 0, gr_full = 0;
  double alpha = 1.0, scale = 1.0;  // scale: silu_scale, already resolved
  bool has_bias = false;
  // Fuxi-alpha: temporal and positional channels (HstuTensors::ts_bias, pos_bias), written
  // as channels 1 and 2 of [rows, 3, heads, dim] outputs.
  bool fuxi_bias = false;
  // Relative attention bias computed per tile (never stored as a plane): the time-gap bucket
  // weight of HstuTensors::timestamps (per key row) and / or the position weight of the
  // offset j - (i + delta), both added like attn_bias. hist_buckets: the buckets a gap can
  // reach (the time-weight gradient's histogram size).
  bool time_bias = false, pos_bias = false;
  const Bucketizer* bucketizer = nullptr;
  const BucketTable* bucket_table = nullptr;
  int64_t hist_buckets = 0;
  bool rel_bias() const { return time_bias || pos_bias; }
  // Per (sequence, kv head) gradient histogram: hist_buckets time buckets, then the
  // 2 * max_k - 1 position offsets.
  int64_t rel_hist_size() const { return hist_buckets + (pos_bias ? 2 * max_k - 1 : 0); }
};

struct HstuSeq {
  int64_t lq, lk, delta, ctx, tgt;
  int64_t gr_max;  // GR rules: the largest id (targets' id; the context rule's column bound)
};

inline HstuSeq SeqOf(const HstuProblem& p, int64_t b) {
  HstuSeq s;
  s.lq = p.off_q[b + 1] - p.off_q[b];
  s.lk = p.off_k[b + 1] - p.off_k[b];
  s.delta = s.lk - s.lq;
  s.ctx = p.gr ? p.gr_context : p.num_context ? p.num_context[b] : 0;
  s.tgt = p.num_target ? p.num_target[b] : 0;
  s.gr_max = s.lk - std::max<int64_t>(p.gr_context - 1, 0) - s.tgt;
  return s;
}

// GR's id of position `pos`: context positions share id 0 (history then counts from 1), and
// every target gets the largest id s.gr_max. Non-decreasing in pos.
RECOPS_INLINE int64_t GrId(const HstuProblem& p, const HstuSeq& s, int64_t pos) {
  const int64_t id = p.gr_context > 0 ? std::max<int64_t>(pos - p.gr_context + 1, 0) : pos;
  return std::min(id, s.gr_max);
}

// GR's rule for query i and key j (same sequence, self-attention): with d = id(i) - id(j)
// (|d| non-causal), visible on the diagonal or where d > 0; a window keeps d <= max_attn_len
// except on rows whose id is within min_full_attn_seq_len of the largest; context rows (id 0)
// also see every key of id < gr_max.
RECOPS_INLINE bool GrVisible(const HstuProblem& p, const HstuSeq& s, int64_t i, int64_t j) {
  const int64_t ri = GrId(p, s, i), cj = GrId(p, s, j);
  int64_t d = ri - cj;
  if (p.mask_type == HstuMask::kNone && d < 0) d = -d;
  bool vis = i == j || d > 0;
  if (p.gr_window > 0 && d > p.gr_window && !(p.gr_full > 0 && ri >= s.gr_max - p.gr_full)) {
    vis = false;
  }
  if (p.gr_context > 0 && ri == 0 && cj < s.gr_max) vis = true;
  return vis;
}

// GR rules: true if row i's visible keys are one interval [lo, hi] (a history row: its id is
// its own, from 1 to gr_max - 1); context and target rows are evaluated key by key.
RECOPS_INLINE bool GrRowInterval(const HstuProblem& p, const HstuSeq& s, int64_t i, int64_t* lo,
                                 int64_t* hi) {
  const int64_t ri = GrId(p, s, i);
  if (ri < 1 || ri >= s.gr_max) return false;
  const int64_t shift = std::max<int64_t>(p.gr_context - 1, 0);  // position = id + shift
  const bool windowed = p.gr_window > 0 && !(p.gr_full > 0 && ri >= s.gr_max - p.gr_full);
  const int64_t first = ri - p.gr_window;  // the smallest id in the window
  *lo = !windowed || first <= 0 ? 0 : first + shift;
  if (p.mask_type == HstuMask::kCausal) {
    *hi = i;
  } else {
    const int64_t last = ri + p.gr_window;  // the largest id in the window
    *hi = !windowed || last >= s.gr_max ? s.lk - 1 : last + shift;
  }
  return true;
}

// Whether query i may see key j (before a custom mask's value multiplies), spec §1 and §6.
RECOPS_INLINE bool HstuVisible(const HstuProblem& p, const HstuSeq& s, int64_t i, int64_t j) {
  if (p.gr) return GrVisible(p, s, i, j);
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
RECOPS_INLINE bool HstuPlainRow(const HstuProblem& p, const HstuSeq& s, int64_t i, int64_t j_end) {
  if (p.mask_type != HstuMask::kCausal) return true;
  if (s.ctx > 0 && i < s.ctx) return false;
  if (p.group > 0 && s.tgt > 0 && i >= s.lq - s.tgt && j_end > s.lk - s.tgt) return false;
  return true;
}

// Conservative: false only if no (i, j) of the tile can be visible.
inline bool HstuTileMaybeVisible(const HstuProblem& p, const HstuSeq& s, int64_t i0, int64_t i1,
                                 int64_t j0, int64_t j1) {
  const int64_t last_i = i1 - 1, last_j = j1 - 1;
  if (p.gr) {
    if (i0 < j1 && j0 < i1) return true;  // a diagonal entry
    if (p.gr_context > 0 && GrId(p, s, i0) == 0 && GrId(p, s, j0) < s.gr_max) return true;
    // Every pair's d lies in [d_min, d_max] (ids do not decrease).
    const int64_t d_min = GrId(p, s, i0) - GrId(p, s, last_j);
    const int64_t d_max = GrId(p, s, last_i) - GrId(p, s, j0);
    const bool unbounded =
        p.gr_window == 0 || (p.gr_full > 0 && GrId(p, s, last_i) >= s.gr_max - p.gr_full);
    const bool ahead = d_max > 0 && (unbounded || d_min <= p.gr_window);
    if (p.mask_type == HstuMask::kCausal) return ahead;
    return ahead || (d_min < 0 && (unbounded || d_max >= -p.gr_window));
  }
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
  if (p.gr) {  // every pair with d != 0 (d > 0 causal) inside the window
    const int64_t d_min = GrId(p, s, i0) - GrId(p, s, last_j);
    const int64_t d_max = GrId(p, s, last_i) - GrId(p, s, j0);
    const bool unbounded =
        p.gr_window == 0 || (p.gr_full > 0 && GrId(p, s, i0) >= s.gr_max - p.gr_full);
    if (d_min > 0) return unbounded || d_max <= p.gr_window;
    return p.mask_type == HstuMask::kNone && d_max < 0 && (unbounded || -d_min <= p.gr_window);
  }
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

// Columns [0, bound) of key block j0..j0+nk that rows [i_begin, i_end) may see: nk unless the
// causal (or right-window) bound cuts the block, which it does on diagonal tiles.
inline int64_t HstuColumnBound(const HstuProblem& p, const HstuSeq& s, int64_t i_begin,
                               int64_t i_end, int64_t j0, int64_t nk) {
  int64_t bound = nk;
  const int64_t last = i_end - 1 + s.delta - j0;  // the last row's diagonal column
  if (p.mask_type == HstuMask::kCausal && !(s.ctx > 0 && i_begin < s.ctx)) {
    bound = std::min(bound, last + 1);
  }
  if (p.window_right >= 0) bound = std::min(bound, last + p.window_right + 1);
  return std::max<int64_t>(bound, 0);
}

template <typename T>
struct HstuTensors {
  const T* q = nullptr;
  const T* k = nullptr;
  const T* v = nullptr;
  const T* mask = nullptr;      // custom mask [B, Nq, max_q, max_k]
  const T* bias = nullptr;      // [B, Nq, max_q, max_k]
  const T* ts_bias = nullptr;   // Fuxi: [B, max_q, max_k]
  const T* pos_bias = nullptr;  // Fuxi: [max_q, max_k]
  const T* grad = nullptr;      // dO [Tq, Nq, Dv]
  T* out = nullptr;
  T* dq = nullptr;
  T* dk = nullptr;
  T* dv = nullptr;
  T* dbias = nullptr;
  // Fuxi backward: Acc planes [B, max_q, max_k] accumulating the timestamp-bias gradient and
  // the per-sequence position-bias gradient, zero on entry (void: HstuTensors is typed by T
  // only).
  void* fuxi_ts_grad = nullptr;
  void* fuxi_pos_grad = nullptr;
  // Relative bias: int64 timestamps per key row, weights [NB] and [2 * max_k - 1], and the
  // backward's Acc histograms [batch, heads_k, rel_hist_size()].
  const int64_t* timestamps = nullptr;
  const T* time_w = nullptr;
  const T* pos_w = nullptr;
  void* rel_grad_acc = nullptr;
  // Paged KV cache (HstuPagedDecodeItem): pages [num_pages, 2, page_size, Nk, D] (K then V),
  // sequence b's pages page_ids[page_offsets[b]..page_offsets[b + 1]), the last holding
  // last_page_len[b] rows; k and v then hold the fresh rows of the queries.
  const T* kv_cache = nullptr;
  const int64_t* page_ids = nullptr;
  const int64_t* page_offsets = nullptr;
  const int64_t* last_page_len = nullptr;
  int64_t page_size = 0;
};

// Streams sequence b's key, value and query rows (every head: contiguous runs) into this
// thread's caches before its items read them head by head, and with `out` its output rows for
// writing (the forward). Only when they total at most kPrefetchSequenceBytes, about an L2
// cache: a longer sequence's first rows would be evicted before they are read. At B=32,
// L<=256 on a Zen 4 this and HstuGroupBySequence made the forward ~5% faster (forward+backward
// ~5-6%), alternating call by call; at L<=1024, where most sequences are over the limit, the
// grouping alone made the forward ~4% faster.
constexpr int64_t kPrefetchSequenceBytes = int64_t{1} << 20;
template <typename T>
void HstuPrefetchSequence(const HstuProblem& p, const HstuTensors<T>& t, int64_t b, bool out) {
  const int64_t ok = p.off_k[b], lk = p.off_k[b + 1] - ok;
  const int64_t oq = p.off_q[b], lq = p.off_q[b + 1] - oq;
  const int64_t channels = p.fuxi_bias ? 3 : 1;
  const int64_t k_bytes = lk * p.heads_k * p.dim_qk * sizeof(T);
  const int64_t v_bytes = lk * p.heads_k * p.dim_v * sizeof(T);
  const int64_t q_bytes = lq * p.heads_q * p.dim_qk * sizeof(T);
  const int64_t out_bytes = out ? lq * channels * p.heads_q * p.dim_v * sizeof(T) : 0;
  if (k_bytes + v_bytes + q_bytes + out_bytes > kPrefetchSequenceBytes) return;
  PrefetchBytes(t.k + ok * p.heads_k * p.dim_qk, k_bytes, /*write=*/false);
  PrefetchBytes(t.v + ok * p.heads_k * p.dim_v, v_bytes, /*write=*/false);
  PrefetchBytes(t.q + oq * p.heads_q * p.dim_qk, q_bytes, /*write=*/false);
  if (out) PrefetchBytes(t.out + oq * channels * p.heads_q * p.dim_v, out_bytes, /*write=*/true);
}

// A work item: rows [row0, row1) of the q side (forward, dQ; h a query head) or of the k side
// (dK, dV; h a kv head) of sequence b; row0 is a multiple of kTile.
struct HstuItem {
  int64_t b, h, row0, row1;
  int64_t cost;  // visible tiles (estimate)
};

// Work items over the q side (kv_side = false, heads = heads_q) or the k side (kv_side = true,
// heads = heads_k): each (sequence, head) is one item, or several consecutive chunks of 64-row
// blocks when that is needed to give every one of `threads` threads about 8 items of similar
// cost. Most expensive first.
std::vector<HstuItem> HstuWorkItems(const HstuProblem& p, bool kv_side, int64_t threads);

// One item per (sequence, kv head) with a non-empty sequence, most expensive first.
std::vector<HstuItem> HstuSequenceItems(const HstuProblem& p);

// Many short sequences: when every item of `items` (HstuWorkItems or HstuSequenceItems: rows of
// the q side, or with kv_side of the k side) is a whole (sequence, head) and there are at least
// 4 sequences per thread, reorders `items` so that each sequence's heads are consecutive
// (sequences still most expensive first) and returns where each sequence's run starts (and,
// last, items->size()); otherwise leaves `items` as they are and returns nothing. One thread
// then runs a sequence's heads in turn after streaming its rows into its caches
// (HstuPrefetchSequence): a head reads 256 B of every row, a pattern the hardware prefetcher
// follows poorly, while a sequence's rows are contiguous.
std::vector<int64_t> HstuGroupBySequence(const HstuProblem& p, bool kv_side, int64_t threads,
                                         std::vector<HstuItem>* items);

constexpr int64_t kTile = 64;
static_assert(kTileQ == kTile && kTileK == kTile, "query and key tiles share one layout");

// Per-thread scratch of the work items, grown on demand and reused across items and op calls
// (fresh per-call buffers page-fault on every call: ~3x the page faults and ~15% slower at
// L = 1024, measured). Operands are packed per item into zero-padded tiles of kTile rows so
// that every tile GEMM reads contiguous blocks (rows 1 KB apart in [rows, heads, dim] conflict
// in L1) and runs over whole register blocks:
//   row tiles [tiles, kTile, dim]; transposed tiles [tiles, dim, kTile] (a tile's Kᵀ is then
//   one [dim x 64] block).
template <typename Acc>
struct HstuWorkspace {
  static HstuWorkspace& ForThread() {
    thread_local HstuWorkspace w;
    return w;
  }
  // Buffer `slot` with room for n elements (contents unspecified).
  Acc* Get(int slot, int64_t n) {
    std::vector<Acc>& buf = buffers[slot];
    if (static_cast<int64_t>(buf.size()) < n) buf.resize(n);
    return buf.data();
  }
  enum Slot : int { kQ, kDout, kDoutT, kDoutP, kK, kKt, kVt, kV, kAcc, kAcc2, kHist, kNumSlots };
  std::vector<Acc> buffers[kNumSlots];
  // Tile buffers (kTile x kTile) and row buffers (kTile).
  Acc s[kTile * kTile], dp[kTile * kTile];
  Acc z[kTile], m[kTile], sig[kTile];
  // Of the last tile scored (TileScores): whether it was computed per row block, and each
  // block's column bound.
  bool partial = false;
  int64_t bound[kTile];
  // The relative bias of the last tile scored (rounded to T) and its time buckets; the
  // position-gradient sums per tile diagonal.
  Acc rel[kTile * kTile];
  int32_t bucket[kTile * kTile];
  Acc diag[2 * kTile];
};

// Rows [r0, r0 + n) of head `head` of x [rows, heads, dim] into ceil(n / kTile) tiles at dst
// (row tiles, or transposed), converted to Acc; padding is zero. The source rows are 256 B of
// every heads * 256 B, a stride the hardware prefetcher follows poorly: rows a few ahead are
// prefetched explicitly (the packing of a forward item is otherwise ~20% of its time,
// waiting on memory).
template <typename T, typename Acc>
RECOPS_INLINE void PackTiles(const T* x, int64_t heads, int64_t head, int64_t dim, int64_t r0,
                             int64_t n, bool transpose, Acc* dst) {
  constexpr int64_t kAhead = 8, kLine = 64 / sizeof(T);
  const int64_t ld = heads * dim;
  const T* base = x + (r0 * heads + head) * dim;
  for (int64_t t0 = 0; t0 < n; t0 += kTile) {
    const int64_t rows = std::min(kTile, n - t0);
    Acc* tile = dst + t0 * dim;
    if (rows < kTile && transpose) {  // zero the padding columns (full tiles are overwritten)
      for (int64_t d = 0; d < dim; ++d)
        std::fill(tile + d * kTile + rows, tile + (d + 1) * kTile, Acc(0));
    } else if (rows < kTile) {  // the padding rows
      std::fill(tile + rows * dim, tile + kTile * dim, Acc(0));
    }
    int64_t r = 0;
    if constexpr (std::is_same_v<T, float> && std::is_same_v<Acc, float>) {
      // Float keys: eight rows at a time through register transposes (element by element,
      // the scattered stores made the transposed pack ~2x the plain one).
      for (; transpose && dim % 8 == 0 && r + 8 <= rows; r += 8) {
        const T* src = base + (t0 + r) * ld;
        for (int64_t a = 0; a < 8 && t0 + r + a + kAhead < n; ++a) {
          for (int64_t d = 0; d < dim; d += kLine) __builtin_prefetch(src + (kAhead + a) * ld + d);
        }
        TransposeRows8(src, ld, dim, tile + r, kTile);
      }
    }
    for (; r < rows; ++r) {
      const T* src = base + (t0 + r) * ld;
      if (t0 + r + kAhead < n) {
        for (int64_t d = 0; d < dim; d += kLine) __builtin_prefetch(src + kAhead * ld + d);
      }
      if (transpose) {
        // Row by row: the source is read sequentially, the scattered writes stay in L1.
        for (int64_t d = 0; d < dim; ++d) tile[d * kTile + r] = ToAcc<T, Acc>(src[d]);
      } else {
        for (int64_t d = 0; d < dim; ++d) tile[r * dim + d] = ToAcc<T, Acc>(src[d]);
      }
    }
  }
  // The bfloat16 GEMMs convert the packed tiles once, not at every tile GEMM.
  if constexpr (std::is_same_v<T, Eigen::bfloat16> && std::is_same_v<Acc, float>) {
    const int64_t tiles = (n + kTile - 1) / kTile;
    if (Bf16DotPath() && tiles > 0)
      Bf16RegisterOperand(dst, transpose ? tiles * dim : tiles * kTile, transpose ? kTile : dim);
  }
}

// The rows of the other side that rows [r0, r1) of one side may see, as whole tiles
// [lo, hi) (lo a multiple of kTile; hi clipped to the sequence); lo >= hi if none.
inline void VisibleRange(const HstuProblem& p, const HstuSeq& s, bool kv_side, int64_t r0,
                         int64_t r1, int64_t* lo, int64_t* hi) {
  const int64_t other = kv_side ? s.lq : s.lk;
  *lo = other;
  *hi = 0;
  for (int64_t o0 = 0; o0 < other; o0 += kTile) {
    const int64_t o1 = std::min(o0 + kTile, other);
    bool any = false;
    for (int64_t x0 = r0; x0 < r1 && !any; x0 += kTile) {
      const int64_t x1 = std::min(x0 + kTile, r1);
      any = kv_side ? HstuTileMaybeVisible(p, s, o0, o1, x0, x1)
                    : HstuTileMaybeVisible(p, s, x0, x1, o0, o1);
    }
    if (any) {
      *lo = std::min(*lo, o0);
      *hi = o1;
    }
  }
}

// The rows of tile (i0.., j0..) worth scoring: mq, or, when only the leading context rows can
// see the tile (the context rule lets them see keys the later rows do not), those rows
// rounded up to the GEMM's row block. The rows left out are invisible in this tile: their
// P and dS are zero, so dropping them changes no sum.
template <Isa I>
RECOPS_INLINE int64_t HstuTileRows(const HstuProblem& p, const HstuSeq& s, int64_t i0, int64_t mq,
                                   int64_t j0, int64_t nk) {
  if (s.ctx <= i0 || s.ctx >= i0 + mq) return mq;
  if (HstuTileMaybeVisible(p, s, s.ctx, i0 + mq, j0, j0 + nk)) return mq;
  return std::min(mq, RoundRows<I>(s.ctx - i0));
}

// Row i's visible columns of key block j0..j0+nk as one interval [lo, hi] (empty when lo > hi),
// where its visibility is one: a fully visible tile, a GR history row, a row under the causal
// and window bounds only. False where the row is evaluated key by key (context rows, target
// groups, GR context and target rows). A custom mask's values are not part of it.
RECOPS_INLINE bool RowInterval(const HstuProblem& p, const HstuSeq& s, int64_t i, int64_t j0,
                               int64_t nk, bool full, int64_t* lo, int64_t* hi) {
  *lo = 0;
  *hi = nk - 1;
  if (full) return true;
  if (p.gr) {
    int64_t gr_lo = 0, gr_hi = 0;
    if (!GrRowInterval(p, s, i, &gr_lo, &gr_hi)) return false;
    *lo = std::max<int64_t>(*lo, gr_lo - j0);
    *hi = std::min<int64_t>(*hi, gr_hi - j0);
    return true;
  }
  if (!HstuPlainRow(p, s, i, j0 + nk)) return false;
  if (p.mask_type == HstuMask::kCausal) *hi = std::min(*hi, i + s.delta - j0);
  if (p.window_left >= 0) *lo = std::max(*lo, i + s.delta - p.window_left - j0);
  if (p.window_right >= 0) *hi = std::min(*hi, i + s.delta + p.window_right - j0);
  return true;
}

// Mask factors (scale · mask value · visibility) for row i of a tile, columns j0..j0+nk.
template <typename T, typename Acc>
RECOPS_INLINE void MaskRow(const HstuProblem& p, const HstuTensors<T>& t, const HstuSeq& s,
                           int64_t b, int64_t h, int64_t i, int64_t j0, int64_t nk, bool full,
                           Acc scale, Acc* m) {
  const T* mask_row = p.mask_type == HstuMask::kCustom
                          ? t.mask + ((b * p.heads_q + h) * p.max_q + i) * p.max_k + j0
                          : nullptr;
  int64_t lo = 0, hi = 0;
  if (RowInterval(p, s, i, j0, nk, full, &lo, &hi)) {
    for (int64_t c = 0; c < nk; ++c) m[c] = c >= lo && c <= hi ? scale : Acc(0);
  } else {
    for (int64_t c = 0; c < nk; ++c) m[c] = HstuVisible(p, s, i, j0 + c) ? scale : Acc(0);
  }
  if (mask_row) {
    for (int64_t c = 0; c < nk; ++c) m[c] *= ToAcc<T, Acc>(mask_row[c]);
  }
}

// Columns of row r of the last tile scored that hold meaningful values: nk, or on a partial
// tile the row's block bound.
template <typename Acc, Isa I>
RECOPS_INLINE int64_t TileColumns(const HstuWorkspace<Acc>& w, int64_t r, int64_t nk) {
  return w.partial ? std::min(nk, w.bound[r / kGemmRows<I>]) : nk;
}

// z = alpha * (round(s) + bias) over n columns. A function of its own so that the pointers'
// restrict qualifiers hold (GCC ignores them on locals; without them it neither vectorises
// this loop nor keeps the thread-local workspace's address out of it).
template <typename T, typename Acc>
RECOPS_INLINE void BiasedScores(const Acc* __restrict s, const Acc* __restrict bias, Acc alpha,
                                int64_t n, Acc* __restrict z) {
  for (int64_t c = 0; c < n; ++c) z[c] = alpha * (RoundTo<T, Acc>(s[c]) + bias[c]);
}

// One row of the relative bias: the time buckets of gaps |ts[c] - ti| and their weights plus
// the position weights pos[c] (either may be absent: nullptr), rounded to T once.
template <typename T, typename Acc, Isa I>
RECOPS_INLINE void RelBiasRow(const int64_t* __restrict ts, int64_t ti, const BucketTable* table,
                              const Bucketizer* exact, const T* __restrict time_w,
                              const T* __restrict pos, int64_t n, int32_t* __restrict bucket,
                              Acc* __restrict rel) {
  if (time_w != nullptr) {
    if (table != nullptr) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
      if constexpr (I == Isa::kAvx512) {
        BucketRowAvx512(*table, ts, ti, n, bucket);
      } else
#endif
      {
        for (int64_t c = 0; c < n; ++c) bucket[c] = (*table)(TimeGap(ts[c], ti));
      }
    } else {
      for (int64_t c = 0; c < n; ++c) bucket[c] = (*exact)(TimeGap(ts[c], ti));
    }
    if (pos != nullptr) {
      for (int64_t c = 0; c < n; ++c) {
        rel[c] = RoundTo<T, Acc>(ToAcc<T, Acc>(time_w[bucket[c]]) + ToAcc<T, Acc>(pos[c]));
      }
    } else {
      for (int64_t c = 0; c < n; ++c) rel[c] = ToAcc<T, Acc>(time_w[bucket[c]]);
    }
  } else {
    for (int64_t c = 0; c < n; ++c) rel[c] = ToAcc<T, Acc>(pos[c]);
  }
}

// The relative bias of tile (i0.., j0..) of sequence b into w.rel (and its time buckets into
// w.bucket): rel = round(time_w[bucket(|t_j - t_(i+delta)|)] + pos_w[max_k - 1 + j - (i +
// delta)]), the sum rounded to T once as a separately built attn_bias would be. Query i is key
// position i + delta (queries are the last positions of the key sequence).
template <typename T, typename Acc, Isa I>
RECOPS_INLINE void RelBiasTile(const HstuProblem& p, const HstuTensors<T>& t, const HstuSeq& s,
                               int64_t b, int64_t i0, int64_t mq, int64_t j0, int64_t nk,
                               HstuWorkspace<Acc>& w) {
  const int64_t* ts = p.time_bias ? t.timestamps + p.off_k[b] : nullptr;
  for (int64_t r = 0; r < mq; ++r) {
    const int64_t key_i = i0 + r + s.delta;
    RelBiasRow<T, Acc, I>(ts ? ts + j0 : nullptr, ts ? ts[key_i] : 0, p.bucket_table, p.bucketizer,
                          p.time_bias ? t.time_w : nullptr,
                          p.pos_bias ? t.pos_w + (p.max_k - 1) + j0 - key_i : nullptr,
                          TileColumns<Acc, I>(w, r, nk), w.bucket + r * kTile, w.rel + r * kTile);
  }
}

// ScoreTile's row in float vectors, in one pass (the scalar form goes through memory three
// times: the mask factors, z, the sigmoid). The mask factor of column c is `scale` inside [lo,
// hi] and 0 outside, or m[c] when m is given. The same operations as ScoreTile in the same
// order, so the same bits. Whole vectors are computed up to nk rounded up (the rows are kTile
// wide); values are stored for columns < nk only.
template <typename T, Isa I>
RECOPS_INLINE void ScoreRowVec(const float* __restrict rel, const float* __restrict m, int64_t lo,
                               int64_t hi, float scale, float alpha, int64_t nk,
                               float* __restrict srow, float* __restrict dprow) {
  using V = typename IsaVec<float, I>::type;
  using Vu = typename IsaVec<uint32_t, I>::type;
  constexpr int64_t W = IsaVec<float, I>::kLanes;
  // Column c is inside [lo, hi] iff c - lo <= hi - lo as unsigned numbers (one compare, which
  // GCC keeps in vectors; lo > hi: no column). The factor is scale's bits where it is, else 0.
  Vu offset;  // c - lo of each lane
  for (int l = 0; l < W; ++l) offset[l] = static_cast<uint32_t>(l - lo);
  const uint32_t span = lo <= hi ? static_cast<uint32_t>(hi - lo) : 0u;
  const bool none = lo > hi;
  uint32_t scale_bits;
  std::memcpy(&scale_bits, &scale, sizeof(scale_bits));
  for (int64_t c = 0; c < nk; c += W, offset += static_cast<uint32_t>(W)) {
    V zs = RoundVecTo<T>(LoadVec<V>(srow + c));
    if (rel != nullptr) zs = zs + LoadVec<V>(rel + c);
    const V z = alpha * zs;
    const V sig = SigmoidVec<I>(z);
    V mv;
    if (m != nullptr) {
      mv = LoadVec<V>(m + c);
    } else {
      const Vu bits = none ? Vu{} : (Vu)(offset <= span) & scale_bits;
      std::memcpy(&mv, &bits, sizeof(mv));
    }
    const V pv = RoundVecTo<T>(z * sig * mv);
    V dv{};
    if (dprow != nullptr) {
      const V dsilu = sig * (1.0f + z * (1.0f - sig));
      dv = RoundVecTo<T>(alpha * mv * dsilu * RoundVecTo<T>(LoadVec<V>(dprow + c)));
    }
    if (c + W <= nk) {
      StoreVec(srow + c, pv);
      if (dprow != nullptr) StoreVec(dprow + c, dv);
    } else {
      StoreVecHead(srow + c, pv, nk - c);
      if (dprow != nullptr) StoreVecHead(dprow + c, dv, nk - c);
    }
  }
}

// Scores of one tile -> P (in place in `sc`), and with `dp` given, dS (in place in `dp`,
// which holds dO·Vᵀ on entry). Rounding to T where the spec's kernels round. Only rows < mq
// and columns < nk are meaningful afterwards; with `bound` (a partial tile's block bounds,
// forward only: P·V reads no further), only columns < bound[r / R] of row r.
template <typename T, typename Acc, Isa I>
RECOPS_INLINE void ScoreTile(const HstuProblem& p, const HstuTensors<T>& t, const HstuSeq& s,
                             int64_t b, int64_t h, int64_t i0, int64_t mq, int64_t j0, int64_t nk,
                             Acc* sc, Acc* dp, HstuWorkspace<Acc>& w,
                             const int64_t* bound = nullptr) {
  const bool full = HstuTileFullyVisible(p, s, i0, i0 + mq, j0, j0 + nk);
  const Acc alpha = static_cast<Acc>(p.alpha);
  if constexpr (std::is_same_v<Acc, float> &&
                (std::is_same_v<T, float> || std::is_same_v<T, Eigen::bfloat16>)) {
    if (!p.has_bias) {
      const float scale = static_cast<float>(p.scale);
      for (int64_t r = 0; r < mq; ++r) {
        int64_t lo = 0, hi = 0;
        const float* m = nullptr;
        if (p.mask_type == HstuMask::kCustom ||
            !RowInterval(p, s, i0 + r, j0, nk, full, &lo, &hi)) {
          MaskRow<T, Acc>(p, t, s, b, h, i0 + r, j0, nk, full, scale, w.m);
          m = w.m;
        }
        const int64_t cols = bound != nullptr ? std::min(nk, bound[r / kGemmRows<I>]) : nk;
        ScoreRowVec<T, I>(p.rel_bias() ? w.rel + r * kTile : nullptr, m, lo, hi, scale, alpha, cols,
                          sc + r * kTileK, dp != nullptr ? dp + r * kTileK : nullptr);
      }
      return;
    }
  }
  Acc* z = w.z;
  Acc* m = w.m;
  Acc* sig = w.sig;
  for (int64_t r = 0; r < mq; ++r) {
    const int64_t i = i0 + r;
    Acc* srow = sc + r * kTileK;
    MaskRow<T, Acc>(p, t, s, b, h, i, j0, nk, full, static_cast<Acc>(p.scale), m);
    if (p.has_bias) {
      const T* bias_row = t.bias + ((b * p.heads_q + h) * p.max_q + i) * p.max_k + j0;
      for (int64_t c = 0; c < nk; ++c) {
        z[c] = alpha * (RoundTo<T, Acc>(srow[c]) + ToAcc<T, Acc>(bias_row[c]));
      }
    } else if (p.rel_bias()) {
      BiasedScores<T, Acc>(srow, w.rel + r * kTile, alpha, nk, z);
    } else {
      for (int64_t c = 0; c < nk; ++c) z[c] = alpha * RoundTo<T, Acc>(srow[c]);
    }
    SigmoidRow<I>(z, nk, sig);
    if (dp == nullptr) {
      for (int64_t c = 0; c < nk; ++c) srow[c] = RoundTo<T, Acc>(z[c] * sig[c] * m[c]);
    } else {
      Acc* dprow = dp + r * kTileK;
      for (int64_t c = 0; c < nk; ++c) {
        srow[c] = RoundTo<T, Acc>(z[c] * sig[c] * m[c]);
        const Acc dsilu = sig[c] * (Acc(1) + z[c] * (Acc(1) - sig[c]));
        dprow[c] = RoundTo<T, Acc>(alpha * m[c] * dsilu * RoundTo<T, Acc>(dprow[c]));
      }
    }
  }
}

// Fuxi: a bias channel's attention weights for tile (i0.., j0..): round(plane[i, j] * m_ij)
// with m the visibility times the custom mask value (no SiLU scale); plane is [max_q, max_k].
template <typename T, typename Acc>
RECOPS_INLINE void FuxiBiasTile(const HstuProblem& p, const HstuTensors<T>& t, const HstuSeq& s,
                                int64_t b, int64_t h, int64_t i0, int64_t mq, int64_t j0,
                                int64_t nk, const T* plane, Acc* out, HstuWorkspace<Acc>& w) {
  const bool full = HstuTileFullyVisible(p, s, i0, i0 + mq, j0, j0 + nk);
  for (int64_t r = 0; r < mq; ++r) {
    MaskRow<T, Acc>(p, t, s, b, h, i0 + r, j0, nk, full, Acc(1), w.m);
    const T* row = plane + (i0 + r) * p.max_k + j0;
    for (int64_t c = 0; c < nk; ++c) {
      out[r * kTile + c] = RoundTo<T, Acc>(ToAcc<T, Acc>(row[c]) * w.m[c]);
    }
  }
}

// A tile GEMM of dtype T's kernels (GemmAcc's arguments): for bfloat16 on the CPU's bfloat16
// dot products where it has them (GemmBf16: every operand of these GEMMs is a bfloat16 number,
// packed from the inputs or rounded to T before it is multiplied), otherwise GemmAcc.
template <typename T, typename Acc, Isa I, bool kOverwrite = false, bool kTransA = false>
RECOPS_INLINE void TileGemm(int64_t M, int64_t N, int64_t K, const Acc* a, int64_t lda,
                            const Acc* b, int64_t ldb, Acc* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, Eigen::bfloat16> && I == Isa::kAvx512) {
    if (Bf16DotPath()) {
      GemmBf16<kOverwrite, kTransA>(M, N, K, a, lda, b, ldb, c, ldc);
      return;
    }
  }
  GemmAcc<Acc, I, kOverwrite, kTransA>(M, N, K, a, lda, b, ldb, c, ldc);
}

// C tile [kTile x kTile] = A row tile (mq rows, ld dim) times a transposed tile (all kTile
// columns; padding columns give zeros): S = Q·Kᵀ or dP = dO·Vᵀ. With `bound`, block r / R of
// R rows only computes its first bound[r / R] columns (rounded up to the GEMM's column block);
// the rest of its row is left as it was.
template <typename T, typename Acc, Isa I>
RECOPS_INLINE void TileTimesT(const Acc* a, int64_t mq, int64_t dim, const Acc* bt, Acc* c,
                              const int64_t* bound = nullptr) {
  constexpr int R = kGemmRows<I>;
  if (bound == nullptr) {
    TileGemm<T, Acc, I, true>(RoundRows<I>(mq), kTile, dim, a, dim, bt, kTile, c, kTile);
    return;
  }
  // A block's columns are its bound rounded up to two vectors, or to one with AVX-512 floats
  // (fewer columns past the diagonal: 443 instead of 462 MFLOP at B=32, L<=256; the forward
  // was 1-2.5% faster, alternating call by call on a Zen 4; AVX2 keeps 2-vector blocks).
  constexpr int64_t kCols =
      (I == Isa::kAvx512 && std::is_same_v<Acc, float> ? 1 : 2) * IsaVec<Acc, I>::kLanes;
  for (int64_t r = 0; r < mq; r += R) {
    if (bound[r / R] == 0) continue;
    TileGemm<T, Acc, I, true>(R, std::min(kTile, (bound[r / R] + kCols - 1) / kCols * kCols), dim,
                              a + r * dim, dim, bt, kTile, c + r * kTile, kTile);
  }
}

// Scores of tile (i0.., j0..) -> P in w.s and, with dout / vt given, dS in w.dp. A partly
// visible (diagonal) tile whose row blocks' column bounds do not decrease down the tile is
// computed per block of R rows up to each block's bound (w.partial; about half the work of a
// causal diagonal tile); values past a block's bound are then stale and must not be read.
// Not with a bias (its gradient is the whole dS row).
// This is the body; the items call TileScores (below), compiled once per dtype and instruction
// set.
template <typename T, typename Acc, Isa I>
RECOPS_INLINE void TileScoresBody(const HstuProblem& p, const HstuTensors<T>& t, const HstuSeq& s,
                                  int64_t b, int64_t h, int64_t i0, int64_t mq, int64_t j0,
                                  int64_t nk, const Acc* q, const Acc* kt, const Acc* dout,
                                  const Acc* vt, HstuWorkspace<Acc>& w) {
  constexpr int R = kGemmRows<I>;
  w.partial = !p.has_bias && !HstuTileFullyVisible(p, s, i0, i0 + mq, j0, j0 + nk);
  for (int64_t r = 0; r < mq && w.partial; r += R) {
    w.bound[r / R] = HstuColumnBound(p, s, i0 + r, i0 + std::min(r + R, mq), j0, nk);
    if (r > 0 && w.bound[r / R] < w.bound[r / R - 1]) w.partial = false;
  }
  const int64_t* bound = w.partial ? w.bound : nullptr;
  if (p.rel_bias()) RelBiasTile<T, Acc, I>(p, t, s, b, i0, mq, j0, nk, w);
  TileTimesT<T, Acc, I>(q, mq, p.dim_qk, kt, w.s, bound);
  if (dout != nullptr) TileTimesT<T, Acc, I>(dout, mq, p.dim_v, vt, w.dp, bound);
  ScoreTile<T, Acc, I>(p, t, s, b, h, i0, mq, j0, nk, w.s, dout != nullptr ? w.dp : nullptr, w,
                       dout == nullptr ? bound : nullptr);
}

// TileScoresBody compiled once per (T, I), with the work items in kernels/hstu_dense_<isa>.cc
// (RECOPS_HSTU_ENTRIES): four items score tiles, and an inlined copy in each was most of their
// compile time. One call per tile costs nothing next to the tile's work.
template <typename T, Isa I>
void HstuTileScores(const HstuProblem& p, const HstuTensors<T>& t, const HstuSeq& s, int64_t b,
                    int64_t h, int64_t i0, int64_t mq, int64_t j0, int64_t nk, const AccumT<T>* q,
                    const AccumT<T>* kt, const AccumT<T>* dout, const AccumT<T>* vt,
                    HstuWorkspace<AccumT<T>>& w);
#define RECOPS_HSTU_TILE_SCORES_SIGNATURE_(T, I)                                                  \
  void HstuTileScores<T, I>(const HstuProblem& p, const HstuTensors<T>& t, const HstuSeq& s,      \
                            int64_t b, int64_t h, int64_t i0, int64_t mq, int64_t j0, int64_t nk, \
                            const AccumT<T>* q, const AccumT<T>* kt, const AccumT<T>* dout,       \
                            const AccumT<T>* vt, HstuWorkspace<AccumT<T>>& w)
#define RECOPS_HSTU_DECLARE_TILE_SCORES_(T, I) \
  template <>                                  \
  RECOPS_HSTU_TILE_SCORES_SIGNATURE_(T, I);
RECOPS_CALL_FLOAT_TYPES_WITH(RECOPS_HSTU_DECLARE_TILE_SCORES_, Isa::kBase)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
RECOPS_CALL_FLOAT_TYPES_WITH(RECOPS_HSTU_DECLARE_TILE_SCORES_, Isa::kAvx2)
RECOPS_CALL_FLOAT_TYPES_WITH(RECOPS_HSTU_DECLARE_TILE_SCORES_, Isa::kAvx512)
#endif
#undef RECOPS_HSTU_DECLARE_TILE_SCORES_

template <typename T, typename Acc, Isa I>
RECOPS_INLINE void TileScores(const HstuProblem& p, const HstuTensors<T>& t, const HstuSeq& s,
                              int64_t b, int64_t h, int64_t i0, int64_t mq, int64_t j0, int64_t nk,
                              const Acc* q, const Acc* kt, const Acc* dout, const Acc* vt,
                              HstuWorkspace<Acc>& w) {
  static_assert(std::is_same_v<Acc, AccumT<T>>, "the items accumulate in AccumT<T>");
  HstuTileScores<T, I>(p, t, s, b, h, i0, mq, j0, nk, q, kt, dout, vt, w);
}

// C (+)= the scored tile's rows (w.s or w.dp, mq x nk) times B (nk rows, ld ldb): P·V or
// dS·K; per row block up to its bound on a partial tile.
template <typename T, typename Acc, Isa I>
RECOPS_INLINE void ScoresTimes(const HstuWorkspace<Acc>& w, const Acc* sc, int64_t mq, int64_t nk,
                               const Acc* b, int64_t n, Acc* c) {
  constexpr int R = kGemmRows<I>;
  if (!w.partial) {
    TileGemm<T, Acc, I>(RoundRows<I>(mq), n, nk, sc, kTile, b, n, c, n);
    return;
  }
  for (int64_t r = 0; r < mq; r += R) {
    if (w.bound[r / R] == 0) continue;
    TileGemm<T, Acc, I>(R, n, w.bound[r / R], sc + r * kTile, kTile, b, n, c + r * n, n);
  }
}

// C (+)= the scored tile's transpose (Pᵀ or dSᵀ, nk x mq) times B (mq rows, ld n): dV += Pᵀ·dO,
// dK += dSᵀ·Q. On a partial tile, key rows c.. are seen only from the first query block whose
// bound exceeds c (bounds do not decrease), so the sum starts there.
template <typename T, typename Acc, Isa I>
RECOPS_INLINE void ScoresTTimes(const HstuWorkspace<Acc>& w, const Acc* sc, int64_t mq, int64_t nk,
                                const Acc* b, int64_t n, Acc* c) {
  constexpr int R = kGemmRows<I>;
  if (!w.partial) {
    TileGemm<T, Acc, I, false, true>(RoundRows<I>(nk), n, mq, sc, kTile, b, n, c, n);
    return;
  }
  int64_t k0 = 0;
  for (int64_t c0 = 0; c0 < nk; c0 += R) {
    while (k0 < mq && w.bound[k0 / R] <= c0) k0 += R;
    if (k0 >= mq) break;
    TileGemm<T, Acc, I, false, true>(R, n, mq - k0, sc + k0 * kTile + c0, kTile, b + k0 * n, n,
                                     c + c0 * n, n);
  }
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

// Forward: output rows [row0, row1) of query head h of sequence b.
template <typename T, typename Acc, Isa I>
RECOPS_INLINE void HstuForwardItem(const HstuProblem& p, const HstuTensors<T>& t,
                                   const HstuItem& item) {
  using W = HstuWorkspace<Acc>;
  const HstuSeq s = SeqOf(p, item.b);
  const int64_t h = item.h, kv = h / (p.heads_q / p.heads_k);
  const int64_t oq = p.off_q[item.b], ok = p.off_k[item.b];
  W& w = W::ForThread();
  int64_t j_lo, j_hi;
  VisibleRange(p, s, /*kv_side=*/false, item.row0, item.row1, &j_lo, &j_hi);
  const int64_t keys = std::max<int64_t>(j_hi - j_lo, 0), key_tiles = (keys + kTile - 1) / kTile;
  Acc* kt = w.Get(W::kKt, key_tiles * kTile * p.dim_qk);
  Acc* v = w.Get(W::kV, key_tiles * kTile * p.dim_v);
  PackTiles<T, Acc>(t.k, p.heads_k, kv, p.dim_qk, ok + j_lo, keys, /*transpose=*/true, kt);
  PackTiles<T, Acc>(t.v, p.heads_k, kv, p.dim_v, ok + j_lo, keys, /*transpose=*/false, v);
  Acc* q = w.Get(W::kQ, kTile * p.dim_qk);
  // Accumulators: the output, and for Fuxi its temporal and positional channels.
  const int64_t channels = p.fuxi_bias ? 3 : 1;
  Acc* o = w.Get(W::kAcc, channels * kTile * p.dim_v);
  Acc* o_t = o + kTile * p.dim_v;
  Acc* o_p = o_t + kTile * p.dim_v;
  for (int64_t i0 = item.row0; i0 < item.row1; i0 += kTile) {
    const int64_t mq = std::min(kTile, item.row1 - i0);
    PackTiles<T, Acc>(t.q, p.heads_q, h, p.dim_qk, oq + i0, mq, /*transpose=*/false, q);
    std::fill(o, o + channels * kTile * p.dim_v, Acc(0));
    for (int64_t j0 = j_lo; j0 < j_hi; j0 += kTile) {
      const int64_t nk = std::min(kTile, s.lk - j0), tile = (j0 - j_lo) / kTile;
      if (!HstuTileMaybeVisible(p, s, i0, i0 + mq, j0, j0 + nk)) continue;
      const int64_t rows = HstuTileRows<I>(p, s, i0, mq, j0, nk);
      TileScores<T, Acc, I>(p, t, s, item.b, h, i0, rows, j0, nk, q, kt + tile * kTile * p.dim_qk,
                            nullptr, nullptr, w);
      ScoresTimes<T, Acc, I>(w, w.s, rows, nk, v + tile * kTile * p.dim_v, p.dim_v, o);
      if (p.fuxi_bias) {
        // The raw masked biases as attention weights (w.dp is free in the forward).
        FuxiBiasTile<T, Acc>(p, t, s, item.b, h, i0, rows, j0, nk,
                             t.ts_bias + item.b * p.max_q * p.max_k, w.dp, w);
        ScoresTimes<T, Acc, I>(w, w.dp, rows, nk, v + tile * kTile * p.dim_v, p.dim_v, o_t);
        FuxiBiasTile<T, Acc>(p, t, s, item.b, h, i0, rows, j0, nk, t.pos_bias, w.dp, w);
        ScoresTimes<T, Acc, I>(w, w.dp, rows, nk, v + tile * kTile * p.dim_v, p.dim_v, o_p);
      }
    }
    for (int64_t c = 0; c < channels; ++c) {
      StoreRows(o + c * kTile * p.dim_v, mq, p.dim_v, t.out, channels * p.heads_q,
                c * p.heads_q + h, oq + i0);
    }
  }
}

// The lines of a byte range, prefetched a few at a time (into L2) between the steps of a pass
// that computes on other data. A burst of 128 prefetches every 128 lines of work did not help at
// all on a Zen 3 VM (the miss queue is full after a few dozen), while 1 per line or bursts of
// up to 64 overlapped most of the reads with the work.
struct PrefetchStream {
  const char* next = nullptr;
  const char* end = nullptr;
  int64_t per_step = 0;
  // The range [x, x + bytes), over `steps` steps.
  void Start(const void* x, int64_t bytes, int64_t steps) {
    next = static_cast<const char*>(x);
    end = next + bytes;
    per_step = ((bytes + 63) / 64 + steps - 1) / std::max<int64_t>(steps, 1);
  }
  RECOPS_INLINE void Step() {
    for (int64_t l = 0; l < per_step && next < end; ++l, next += 64) __builtin_prefetch(next, 0, 1);
  }
};

// Query rows (query heads sharing a kv head x queries) up to which a paged sequence takes
// HstuPagedDecodeItem rather than the tiled forward on gathered keys.
constexpr int64_t kDecodeRows = 16;

// Paged forward of one sequence with at most kDecodeRows query rows per kv head (a decode
// step: a few new tokens against a long cache), reading the cached pages in place. The rows of
// a kv head (the query heads of its group x the queries) are few, so no GEMM with a 64-row
// tile runs. Per chunk of at most kTile keys (all kv heads' rows of a key are contiguous):
//  - the scores are dot products of the chunk's key rows with each query row (DotRows:
//    vectors over the head dimension, the keys' sums reduced together);
//  - the tiled path's ScoreTile applies the same rounding points and mask;
//  - O += P·V over the query rows exactly (FewRowsGemmAcc), with V read from the page.
// The step is bound by reading the cache, so each pass prefetches what the next one reads: the
// score pass this chunk's V, the P·V pass the next chunk's K, a few lines per step
// (PrefetchStream). Without it, each pass waited on its own misses: the hardware prefetcher
// restarts at every 4 KB page, and the arithmetic between loads keeps the core from running far
// ahead (measured on a Zen 3 VM, one thread: 141 ms without, 70 ms with; a plain read of the
// same bytes, 48 ms). Keys are summed in order (j ascending) as the tiled path sums them; the
// scores' sums over the head dimension run in another order, so the results differ from the
// gathered path by rounding. bfloat16 / float16 chunks are converted into the workspace.
template <typename T, typename Acc, Isa I>
RECOPS_INLINE void HstuPagedDecodeItem(const HstuProblem& p, const HstuTensors<T>& t,
                                       const HstuItem& item) {
  using W = HstuWorkspace<Acc>;
  constexpr bool kInPlace = std::is_same_v<T, Acc>;
  constexpr int64_t kLanes = IsaVec<Acc, I>::kLanes;
  // Keys per step of the P·V pass: the output rows are loaded and stored once per block.
  constexpr int64_t kPvKeys = 8;
  const int64_t b = item.b, hk_n = p.heads_k, group = p.heads_q / p.heads_k;
  const HstuSeq s = SeqOf(p, b);
  const int64_t rows = group * s.lq, dqk = p.dim_qk, dv = p.dim_v;
  const int64_t ldk = hk_n * dqk, ldv = hk_n * dv;
  W& w = W::ForThread();
  // Per kv head: its query rows ([rows, dqk]), outputs ([rows, dv]) and a chunk's scores
  // ([rows, kTile]; row r = g * lq + i is query i of head hk * group + g).
  Acc* q = w.Get(W::kQ, hk_n * rows * dqk);
  Acc* o = w.Get(W::kAcc, hk_n * rows * dv);
  Acc* sc = w.Get(W::kAcc2, hk_n * rows * kTile);
  Acc* kc = kInPlace ? nullptr : w.Get(W::kK, kTile * ldk);
  Acc* vc = kInPlace ? nullptr : w.Get(W::kV, kTile * ldv);
  std::fill(o, o + hk_n * rows * dv, Acc(0));
  for (int64_t hk = 0; hk < hk_n; ++hk) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t h = hk * group + r / s.lq, i = r % s.lq;
      const T* src = t.q + ((p.off_q[b] + i) * p.heads_q + h) * dqk;
      for (int64_t d = 0; d < dqk; ++d) q[(hk * rows + r) * dqk + d] = ToAcc<T, Acc>(src[d]);
    }
  }
  // The key chunks with visible keys, in sequence order (a lambda would not inherit the
  // entry's target attribute): keys j0.. of the sequence, n rows of [n, Nk, D] at k_rows /
  // v_rows.
  struct Chunk {
    const T* k_rows;
    const T* v_rows;
    int64_t j0, n;
  };
  std::vector<Chunk> chunks;
  const auto add = [&](const T* k_rows, const T* v_rows, int64_t j0, int64_t n) {
    if (HstuTileMaybeVisible(p, s, 0, s.lq, j0, j0 + n)) chunks.push_back({k_rows, v_rows, j0, n});
  };
  int64_t j = 0;
  for (int64_t pg = t.page_offsets[b]; pg < t.page_offsets[b + 1]; ++pg) {
    const int64_t n = pg + 1 < t.page_offsets[b + 1] ? t.page_size : t.last_page_len[b];
    const T* page = t.kv_cache + t.page_ids[pg] * 2 * t.page_size * ldk;
    for (int64_t c0 = 0; c0 < n; c0 += kTile) {
      add(page + c0 * ldk, page + (t.page_size + c0) * ldv, j + c0, std::min(kTile, n - c0));
    }
    j += n;
  }
  const int64_t first = p.off_q[b + 1] - s.tgt;
  for (int64_t c0 = 0; c0 < s.tgt; c0 += kTile) {
    add(t.k + (first + c0) * ldk, t.v + (first + c0) * ldv, j + c0, std::min(kTile, s.tgt - c0));
  }
  PrefetchStream ahead;
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    const Chunk& ch = chunks[ci];
    const int64_t j0 = ch.j0, n = ch.n;
    const int64_t steps_k = (n + kLanes - 1) / kLanes, steps_v = (n + kPvKeys - 1) / kPvKeys;
    const Chunk* next = ci + 1 < chunks.size() ? &chunks[ci + 1] : nullptr;
    const Acc* kr;
    const Acc* vr;
    if constexpr (kInPlace) {
      kr = ch.k_rows;
    } else {
      for (int64_t e = 0; e < n * ldk; ++e) kc[e] = ToAcc<T, Acc>(ch.k_rows[e]);
      kr = kc;
    }
    ahead.Start(ch.v_rows, n * ldv * sizeof(T), steps_k * hk_n * rows);
    for (int64_t c0 = 0; c0 < n; c0 += kLanes) {
      // The block's key rows; past the chunk's end, its last row again (lanes ignored).
      int64_t offset[kLanes];
      for (int64_t k = 0; k < kLanes; ++k) offset[k] = std::min(c0 + k, n - 1) * ldk;
      for (int64_t hk = 0; hk < hk_n; ++hk) {
        for (int64_t r = 0; r < rows; ++r) {
          ahead.Step();
          DotRows<Acc, I>(kr + hk * dqk, offset, q + (hk * rows + r) * dqk, dqk,
                          sc + (hk * rows + r) * kTile + c0);
        }
      }
    }
    for (int64_t hk = 0; hk < hk_n; ++hk) {
      for (int64_t g = 0; g < group; ++g) {
        ScoreTile<T, Acc, I>(p, t, s, b, hk * group + g, 0, s.lq, j0, n,
                             sc + (hk * rows + g * s.lq) * kTile, nullptr, w);
      }
    }
    if constexpr (kInPlace) {
      vr = ch.v_rows;
    } else {
      for (int64_t e = 0; e < n * ldv; ++e) vc[e] = ToAcc<T, Acc>(ch.v_rows[e]);
      vr = vc;
    }
    ahead.Start(next ? next->k_rows : nullptr, next ? next->n * ldk * sizeof(T) : 0,
                steps_v * hk_n);
    for (int64_t c0 = 0; c0 < n; c0 += kPvKeys) {
      for (int64_t hk = 0; hk < hk_n; ++hk) {
        ahead.Step();
        FewRowsGemmAcc<Acc, I>(rows, dv, std::min(kPvKeys, n - c0), sc + hk * rows * kTile + c0,
                               kTile, vr + c0 * ldv + hk * dv, ldv, o + hk * rows * dv, dv);
      }
    }
  }
  for (int64_t hk = 0; hk < hk_n; ++hk) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t h = hk * group + r / s.lq, i = r % s.lq;
      T* dst = t.out + ((p.off_q[b] + i) * p.heads_q + h) * dv;
      const Acc* src = o + (hk * rows + r) * dv;
      for (int64_t d = 0; d < dv; ++d) dst[d] = FromAcc<T, Acc>(src[d]);
    }
  }
}

// One (query block, key block) tile of the backward, from packed tiles (q, dO: row tiles of
// the query block; kt, vt: transposed tiles of the key block): recomputes P and dS, adds the
// tile's dV (Pᵀ·dO) and dK (dSᵀ·Q) into the key block's accumulators (kTile rows); leaves dS
// in w.dp.
template <typename T, typename Acc, Isa I>
RECOPS_INLINE void BackwardTileKv(const HstuProblem& p, const HstuTensors<T>& t, const HstuSeq& s,
                                  int64_t b, int64_t h, int64_t i0, int64_t mq, int64_t j0,
                                  int64_t nk, const Acc* q, const Acc* dout, const Acc* kt,
                                  const Acc* vt, HstuWorkspace<Acc>& w, Acc* dk, Acc* dv) {
  TileScores<T, Acc, I>(p, t, s, b, h, i0, mq, j0, nk, q, kt, dout, vt, w);
  // Pᵀ and dSᵀ read in place (transposed A operand).
  ScoresTTimes<T, Acc, I>(w, w.s, mq, nk, dout, p.dim_v, dv);
  ScoresTTimes<T, Acc, I>(w, w.dp, mq, nk, q, p.dim_qk, dk);
}

// With dS of a tile in w.dp: dQ (of the tile's query rows, ld Dqk, room for kTile rows) +=
// dS·K (k: the key block's row tile), and the bias gradient of the tile = dS.
template <typename T, typename Acc, Isa I>
RECOPS_INLINE void BackwardTileQ(const HstuProblem& p, const HstuTensors<T>& t, int64_t b,
                                 int64_t h, int64_t i0, int64_t mq, int64_t j0, int64_t nk,
                                 const Acc* k, const HstuWorkspace<Acc>& w, Acc* dq) {
  ScoresTimes<T, Acc, I>(w, w.dp, mq, nk, k, p.dim_qk, dq);
  if (p.has_bias) {
    for (int64_t r = 0; r < mq; ++r) {
      T* row = t.dbias + ((b * p.heads_q + h) * p.max_q + i0 + r) * p.max_k + j0;
      for (int64_t c = 0; c < nk; ++c) row[c] = FromAcc<T, Acc>(w.dp[r * kTile + c]);
    }
  }
}

// The packed operands of a backward item: for the query rows [i_lo, i_hi) of each head of
// the group, q and dO row tiles ([group][tiles]); for the key rows [j_lo, j_hi), k row tiles
// and kt, vt transposed tiles. Each pointer is to the tile of row i0 / j0 via Q(), Do(), ...
template <typename Acc>
struct HstuBackwardPack {
  const Acc *q, *dout, *k, *kt, *vt;
  const Acc *dout_t, *dout_p;  // Fuxi: the temporal and positional channels' dO
  int64_t i_lo, q_tiles, j_lo, dim_qk, dim_v;
  const Acc* Q(int64_t g, int64_t i0) const { return q + QIndex(g, i0) * dim_qk; }
  const Acc* Do(int64_t g, int64_t i0) const { return dout + QIndex(g, i0) * dim_v; }
  const Acc* DoT(int64_t g, int64_t i0) const { return dout_t + QIndex(g, i0) * dim_v; }
  const Acc* DoP(int64_t g, int64_t i0) const { return dout_p + QIndex(g, i0) * dim_v; }
  const Acc* K(int64_t j0) const { return k + (j0 - j_lo) * dim_qk; }
  const Acc* Kt(int64_t j0) const { return kt + (j0 - j_lo) * dim_qk; }
  const Acc* Vt(int64_t j0) const { return vt + (j0 - j_lo) * dim_v; }
  int64_t QIndex(int64_t g, int64_t i0) const { return g * q_tiles * kTile + (i0 - i_lo); }
};

// Packs the operands of a backward item over query rows [i_lo, i_hi) (heads of kv head kv's
// group) and key rows [j_lo, j_hi); k row tiles only if with_k (the dQ side).
template <typename T, typename Acc>
RECOPS_INLINE HstuBackwardPack<Acc> PackBackward(const HstuProblem& p, const HstuTensors<T>& t,
                                                 int64_t b, int64_t kv, int64_t i_lo, int64_t i_hi,
                                                 int64_t j_lo, int64_t j_hi, bool with_k,
                                                 HstuWorkspace<Acc>& w) {
  using W = HstuWorkspace<Acc>;
  const int64_t group = p.heads_q / p.heads_k;
  const int64_t rows_q = std::max<int64_t>(i_hi - i_lo, 0),
                keys = std::max<int64_t>(j_hi - j_lo, 0);
  const int64_t q_tiles = (rows_q + kTile - 1) / kTile, k_tiles = (keys + kTile - 1) / kTile;
  HstuBackwardPack<Acc> pk{};
  pk.i_lo = i_lo;
  pk.j_lo = j_lo;
  pk.q_tiles = q_tiles;
  pk.dim_qk = p.dim_qk;
  pk.dim_v = p.dim_v;
  Acc* q = w.Get(W::kQ, group * q_tiles * kTile * p.dim_qk);
  // dO rows hold one [heads, dim] block per channel (Fuxi with biases: three).
  const int64_t channels = p.fuxi_bias ? 3 : 1, grad_heads = channels * p.heads_q;
  Acc* dout[3] = {w.Get(W::kDout, group * q_tiles * kTile * p.dim_v), nullptr, nullptr};
  if (p.fuxi_bias) {
    dout[1] = w.Get(W::kDoutT, group * q_tiles * kTile * p.dim_v);
    dout[2] = w.Get(W::kDoutP, group * q_tiles * kTile * p.dim_v);
  }
  for (int64_t g = 0; g < group; ++g) {
    const int64_t h = kv * group + g;
    PackTiles<T, Acc>(t.q, p.heads_q, h, p.dim_qk, p.off_q[b] + i_lo, rows_q, false,
                      q + g * q_tiles * kTile * p.dim_qk);
    for (int64_t c = 0; c < channels; ++c) {
      PackTiles<T, Acc>(t.grad, grad_heads, c * p.heads_q + h, p.dim_v, p.off_q[b] + i_lo, rows_q,
                        false, dout[c] + g * q_tiles * kTile * p.dim_v);
    }
  }
  Acc* kt = w.Get(W::kKt, k_tiles * kTile * p.dim_qk);
  Acc* vt = w.Get(W::kVt, k_tiles * kTile * p.dim_v);
  PackTiles<T, Acc>(t.k, p.heads_k, kv, p.dim_qk, p.off_k[b] + j_lo, keys, true, kt);
  PackTiles<T, Acc>(t.v, p.heads_k, kv, p.dim_v, p.off_k[b] + j_lo, keys, true, vt);
  Acc* k = nullptr;
  if (with_k) {
    k = w.Get(W::kK, k_tiles * kTile * p.dim_qk);
    PackTiles<T, Acc>(t.k, p.heads_k, kv, p.dim_qk, p.off_k[b] + j_lo, keys, false, k);
  }
  pk.q = q;
  pk.dout = dout[0];
  pk.dout_t = dout[1];
  pk.dout_p = dout[2];
  pk.k = k;
  pk.kt = kt;
  pk.vt = vt;
  return pk;
}

// plane[i, j] += m_ij * g[i, j] on the visible entries of tile (i0.., j0..) (m: visibility
// times the custom mask value; entries past a partial tile's bounds are invisible and skipped).
template <typename T, typename Acc>
RECOPS_INLINE void AddMaskedTile(const HstuProblem& p, const HstuTensors<T>& t, const HstuSeq& s,
                                 int64_t b, int64_t h, int64_t i0, int64_t mq, int64_t j0,
                                 int64_t nk, const Acc* g, Acc* plane, HstuWorkspace<Acc>& w) {
  const bool full = HstuTileFullyVisible(p, s, i0, i0 + mq, j0, j0 + nk);
  for (int64_t r = 0; r < mq; ++r) {
    MaskRow<T, Acc>(p, t, s, b, h, i0 + r, j0, nk, full, Acc(1), w.m);
    Acc* row = plane + (i0 + r) * p.max_k + j0;
    for (int64_t c = 0; c < nk; ++c) {
      if (w.m[c] != Acc(0)) row[c] += w.m[c] * g[r * kTile + c];
    }
  }
}

// One row of RelBiasGradTile (restrict parameters: see BiasedScores).
template <typename Acc>
RECOPS_INLINE void RelBiasGradRow(const Acc* __restrict ds, const int32_t* __restrict bucket,
                                  int64_t n, Acc* __restrict hist, Acc* __restrict diag) {
  if (bucket != nullptr) {
    for (int64_t c = 0; c < n; ++c) hist[4 * bucket[c] + (c & 3)] += ds[c];
  }
  if (diag != nullptr) {
    for (int64_t c = 0; c < n; ++c) diag[c] += ds[c];
  }
}

// Relative-bias gradient of one tile from dS in w.dp (after TileScores): each time bucket's
// sum (into `hist`, four interleaved copies [bucket][4] so that runs of one bucket do not
// chain through memory) and each position offset's (per tile diagonal, then into `pos`, the
// [2 * max_k - 1] histogram). Entries past a partial tile's bounds are invisible and skipped;
// invisible entries inside them have dS = 0.
template <typename Acc, Isa I>
RECOPS_INLINE void RelBiasGradTile(const HstuProblem& p, const HstuSeq& s, int64_t i0, int64_t mq,
                                   int64_t j0, int64_t nk, HstuWorkspace<Acc>& w, Acc* hist,
                                   Acc* pos) {
  if (p.pos_bias) std::fill(w.diag, w.diag + 2 * kTile, Acc(0));
  for (int64_t r = 0; r < mq; ++r) {
    // diag + kTile - r: element c is the tile's diagonal c - r.
    RelBiasGradRow<Acc>(w.dp + r * kTile, p.time_bias ? w.bucket + r * kTile : nullptr,
                        TileColumns<Acc, I>(w, r, nk), hist,
                        p.pos_bias ? w.diag + kTile - r : nullptr);
  }
  if (!p.pos_bias) return;
  // Tile diagonal x (offset x - kTile) is key offset j - (i + delta) = x - kTile + j0 - i0 -
  // delta; x runs over the offsets the tile has.
  Acc* dst = pos + (p.max_k - 1) + j0 - i0 - s.delta - kTile;
  for (int64_t x = kTile - mq + 1; x < kTile + nk; ++x) dst[x] += w.diag[x];
}

// Fuxi backward extras of one tile (after BackwardTileKv and BackwardTileQ, which leave w.s and
// w.dp free): dV += Tbᵀ·dO_t + Pbᵀ·dO_p, and the bias gradients m ⊙ (dO_t·Vᵀ) (timestamp bias
// of sequence b) and m ⊙ (dO_p·Vᵀ) (position bias, per sequence, summed later).
template <typename T, typename Acc, Isa I>
RECOPS_INLINE void FuxiBackwardTile(const HstuProblem& p, const HstuTensors<T>& t, const HstuSeq& s,
                                    int64_t b, int64_t h, int64_t i0, int64_t mq, int64_t j0,
                                    int64_t nk, const Acc* dout_t, const Acc* dout_p, const Acc* vt,
                                    HstuWorkspace<Acc>& w, Acc* dv) {
  const int64_t plane = p.max_q * p.max_k;
  Acc* d_ts = static_cast<Acc*>(t.fuxi_ts_grad) + b * plane;
  Acc* d_pos = static_cast<Acc*>(t.fuxi_pos_grad) + b * plane;
  const Acc* dos[2] = {dout_t, dout_p};
  const T* biases[2] = {t.ts_bias + b * plane, t.pos_bias};
  Acc* grads[2] = {d_ts, d_pos};
  for (int ch = 0; ch < 2; ++ch) {
    FuxiBiasTile<T, Acc>(p, t, s, b, h, i0, mq, j0, nk, biases[ch], w.s, w);
    ScoresTTimes<T, Acc, I>(w, w.s, mq, nk, dos[ch], p.dim_v, dv);
    TileTimesT<T, Acc, I>(dos[ch], mq, p.dim_v, vt, w.dp, w.partial ? w.bound : nullptr);
    AddMaskedTile<T, Acc>(p, t, s, b, h, i0, mq, j0, nk, w.dp, grads[ch], w);
  }
}

// Backward, key side: dK and dV of key rows [row0, row1) of kv head item.h, summed over the
// query heads of its group and all query blocks (no other item writes them).
template <typename T, typename Acc, Isa I>
RECOPS_INLINE void HstuBackwardKvItem(const HstuProblem& p, const HstuTensors<T>& t,
                                      const HstuItem& item) {
  using W = HstuWorkspace<Acc>;
  const HstuSeq s = SeqOf(p, item.b);
  const int64_t kv = item.h, group = p.heads_q / p.heads_k;
  W& w = W::ForThread();
  int64_t i_lo, i_hi;
  VisibleRange(p, s, /*kv_side=*/true, item.row0, item.row1, &i_lo, &i_hi);
  const HstuBackwardPack<Acc> pk =
      PackBackward<T, Acc>(p, t, item.b, kv, i_lo, i_hi, item.row0, item.row1, false, w);
  Acc* dk = w.Get(W::kAcc, kTile * p.dim_qk);
  Acc* dv = w.Get(W::kAcc2, kTile * p.dim_v);
  for (int64_t j0 = item.row0; j0 < item.row1; j0 += kTile) {
    const int64_t nk = std::min(kTile, item.row1 - j0);
    std::fill(dk, dk + kTile * p.dim_qk, Acc(0));
    std::fill(dv, dv + kTile * p.dim_v, Acc(0));
    for (int64_t g = 0; g < group; ++g) {
      for (int64_t i0 = i_lo; i0 < i_hi; i0 += kTile) {
        const int64_t mq = std::min(kTile, s.lq - i0);
        if (!HstuTileMaybeVisible(p, s, i0, i0 + mq, j0, j0 + nk)) continue;
        BackwardTileKv<T, Acc, I>(p, t, s, item.b, kv * group + g, i0,
                                  HstuTileRows<I>(p, s, i0, mq, j0, nk), j0, nk, pk.Q(g, i0),
                                  pk.Do(g, i0), pk.Kt(j0), pk.Vt(j0), w, dk, dv);
      }
    }
    StoreRows(dk, nk, p.dim_qk, t.dk, p.heads_k, kv, p.off_k[item.b] + j0);
    StoreRows(dv, nk, p.dim_v, t.dv, p.heads_k, kv, p.off_k[item.b] + j0);
  }
}

// Backward, query side: dQ of query rows [row0, row1) of head item.h, and the bias gradient
// (= dS) of those rows.
template <typename T, typename Acc, Isa I>
RECOPS_INLINE void HstuBackwardQItem(const HstuProblem& p, const HstuTensors<T>& t,
                                     const HstuItem& item) {
  using W = HstuWorkspace<Acc>;
  const HstuSeq s = SeqOf(p, item.b);
  const int64_t group = p.heads_q / p.heads_k, h = item.h, kv = h / group;
  W& w = W::ForThread();
  int64_t j_lo, j_hi;
  VisibleRange(p, s, /*kv_side=*/false, item.row0, item.row1, &j_lo, &j_hi);
  // Packs q and dO of every head of the group (one is used): the packing is shared code and
  // its cost is small against the item's tiles.
  const HstuBackwardPack<Acc> pk =
      PackBackward<T, Acc>(p, t, item.b, kv, item.row0, item.row1, j_lo, j_hi, true, w);
  Acc* dq = w.Get(W::kAcc, kTile * p.dim_qk);
  for (int64_t i0 = item.row0; i0 < item.row1; i0 += kTile) {
    const int64_t mq = std::min(kTile, item.row1 - i0);
    std::fill(dq, dq + kTile * p.dim_qk, Acc(0));
    for (int64_t j0 = j_lo; j0 < j_hi; j0 += kTile) {
      const int64_t nk = std::min(kTile, s.lk - j0);
      if (!HstuTileMaybeVisible(p, s, i0, i0 + mq, j0, j0 + nk)) continue;
      const int64_t rows = HstuTileRows<I>(p, s, i0, mq, j0, nk);
      TileScores<T, Acc, I>(p, t, s, item.b, h, i0, rows, j0, nk, pk.Q(h - kv * group, i0),
                            pk.Kt(j0), pk.Do(h - kv * group, i0), pk.Vt(j0), w);
      BackwardTileQ<T, Acc, I>(p, t, item.b, h, i0, rows, j0, nk, pk.K(j0), w, dq);
    }
    StoreRows(dq, mq, p.dim_qk, t.dq, p.heads_q, h, p.off_q[item.b] + i0);
  }
}

// Backward in one pass over a whole (sequence, kv head) (used when there are enough of them to
// keep every thread busy): per key block, dK and dV as in HstuBackwardKvItem, and dQ of every
// query block accumulated in a per-item buffer, so each tile's scores are computed once (5
// tile GEMMs instead of 7). The summation orders equal those of the two-pass path (dK, dV:
// query heads then query blocks ascending; dQ: key blocks ascending), so both paths give the
// same bits.
template <typename T, typename Acc, Isa I>
RECOPS_INLINE void HstuBackwardSeqHead(const HstuProblem& p, const HstuTensors<T>& t, int64_t b,
                                       int64_t kv) {
  using W = HstuWorkspace<Acc>;
  const HstuSeq s = SeqOf(p, b);
  const int64_t group = p.heads_q / p.heads_k;
  W& w = W::ForThread();
  const HstuBackwardPack<Acc> pk = PackBackward<T, Acc>(p, t, b, kv, 0, s.lq, 0, s.lk, true, w);
  const int64_t q_rows = pk.q_tiles * kTile;
  // Relative bias: this item's histograms (time: four interleaved copies in the workspace).
  Acc* rel_grad = p.rel_bias()
                      ? static_cast<Acc*>(t.rel_grad_acc) + (b * p.heads_k + kv) * p.rel_hist_size()
                      : nullptr;
  Acc* hist = p.time_bias ? w.Get(W::kHist, 4 * p.hist_buckets) : nullptr;
  if (hist) std::fill(hist, hist + 4 * p.hist_buckets, Acc(0));
  Acc* dq = w.Get(W::kAcc, group * q_rows * p.dim_qk);
  std::fill(dq, dq + group * q_rows * p.dim_qk, Acc(0));
  Acc* dk = w.Get(W::kAcc2, kTile * (p.dim_qk + p.dim_v));
  Acc* dv = dk + kTile * p.dim_qk;
  for (int64_t j0 = 0; j0 < s.lk; j0 += kTile) {
    const int64_t nk = std::min(kTile, s.lk - j0);
    std::fill(dk, dk + kTile * (p.dim_qk + p.dim_v), Acc(0));
    for (int64_t g = 0; g < group; ++g) {
      const int64_t h = kv * group + g;
      for (int64_t i0 = 0; i0 < s.lq; i0 += kTile) {
        if (!HstuTileMaybeVisible(p, s, i0, std::min(i0 + kTile, s.lq), j0, j0 + nk)) continue;
        const int64_t mq = HstuTileRows<I>(p, s, i0, std::min(kTile, s.lq - i0), j0, nk);
        BackwardTileKv<T, Acc, I>(p, t, s, b, h, i0, mq, j0, nk, pk.Q(g, i0), pk.Do(g, i0),
                                  pk.Kt(j0), pk.Vt(j0), w, dk, dv);
        BackwardTileQ<T, Acc, I>(p, t, b, h, i0, mq, j0, nk, pk.K(j0), w,
                                 dq + (g * q_rows + i0) * p.dim_qk);
        if (p.fuxi_bias) {
          FuxiBackwardTile<T, Acc, I>(p, t, s, b, h, i0, mq, j0, nk, pk.DoT(g, i0), pk.DoP(g, i0),
                                      pk.Vt(j0), w, dv);
        }
        if (rel_grad != nullptr) {
          RelBiasGradTile<Acc, I>(p, s, i0, mq, j0, nk, w, hist, rel_grad + p.hist_buckets);
        }
      }
    }
    StoreRows(dk, nk, p.dim_qk, t.dk, p.heads_k, kv, p.off_k[b] + j0);
    StoreRows(dv, nk, p.dim_v, t.dv, p.heads_k, kv, p.off_k[b] + j0);
  }
  for (int64_t g = 0; g < group; ++g) {
    StoreRows(dq + g * q_rows * p.dim_qk, s.lq, p.dim_qk, t.dq, p.heads_q, kv * group + g,
              p.off_q[b]);
  }
  for (int64_t k = 0; hist != nullptr && k < p.hist_buckets; ++k) {
    rel_grad[k] = (hist[4 * k] + hist[4 * k + 1]) + (hist[4 * k + 2] + hist[4 * k + 3]);
  }
}

// Backward in one pass over a whole (sequence, kv head) (used when there are enough of them to
// keep every thread busy), or with item.h < 0 over every kv head of the sequence in turn (Fuxi
// with biases: the sequence's bias-gradient plane then has one writer). Per key block, dK and
// dV as in HstuBackwardKvItem, and dQ of every query block accumulated in a per-item buffer,
// so each tile's scores are computed once (5 tile GEMMs instead of 7). The summation orders
// equal those of the two-pass path (dK, dV: query heads then query blocks ascending; dQ: key
// blocks ascending), so both paths give the same bits.
template <typename T, typename Acc, Isa I>
RECOPS_INLINE void HstuBackwardSeqItem(const HstuProblem& p, const HstuTensors<T>& t,
                                       const HstuItem& item) {
  const int64_t first = item.h < 0 ? 0 : item.h, last = item.h < 0 ? p.heads_k : item.h + 1;
  for (int64_t kv = first; kv < last; ++kv) HstuBackwardSeqHead<T, Acc, I>(p, t, item.b, kv);
}

// The work items of one dtype, compiled for one instruction set: called many times per op
// through these pointers (entry points rather than RECOPS_WITH_ISA).
template <typename T>
struct HstuEntries {
  using Fn = void (*)(const HstuProblem&, const HstuTensors<T>&, const HstuItem&);
  Fn forward, backward_kv, backward_q, backward_seq, paged_decode;
};

// The work items for instruction set I, compiled once each in its own translation unit,
// kernels/hstu_dense_<isa>.cc (AVX-512, AVX2 + FMA, baseline x86-64), for the float dtypes
// (T = float, Eigen::half, Eigen::bfloat16, double).
template <typename T, Isa I>
HstuEntries<T> HstuEntriesFor();
#define RECOPS_HSTU_DECLARE_ENTRIES_FOR(T, I) \
  template <>                                 \
  HstuEntries<T> HstuEntriesFor<T, I>();
RECOPS_CALL_FLOAT_TYPES_WITH(RECOPS_HSTU_DECLARE_ENTRIES_FOR, Isa::kBase)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
RECOPS_CALL_FLOAT_TYPES_WITH(RECOPS_HSTU_DECLARE_ENTRIES_FOR, Isa::kAvx2)
RECOPS_CALL_FLOAT_TYPES_WITH(RECOPS_HSTU_DECLARE_ENTRIES_FOR, Isa::kAvx512)
#endif
#undef RECOPS_HSTU_DECLARE_ENTRIES_FOR

// The work items for the best instruction set of this CPU (BestIsa), picked once
// (kernels/hstu_dense.cc).
template <typename T>
const HstuEntries<T>& HstuBestEntries();

// Defines HstuEntriesFor<T, I>() for the float dtypes with the work items compiled under the
// target attribute ATTR (I's instruction set): the body of kernels/hstu_dense_<isa>.cc.
#define RECOPS_HSTU_ENTRY(NAME, ITEM, I, ATTR)                                       \
  template <typename T>                                                              \
  ATTR void NAME(const HstuProblem& p, const HstuTensors<T>& t, const HstuItem& i) { \
    const Bf16Item bf16_item(std::is_same_v<T, Eigen::bfloat16>);                    \
    ITEM<T, AccumT<T>, I>(p, t, i);                                                  \
  }
#define RECOPS_HSTU_ENTRIES_FOR(T, I)                                           \
  template <>                                                                   \
  HstuEntries<T> HstuEntriesFor<T, I>() {                                       \
    return {HstuForwardEntry<T>, HstuBackwardKvEntry<T>, HstuBackwardQEntry<T>, \
            HstuBackwardSeqEntry<T>, HstuPagedDecodeEntry<T>};                  \
  }
#define RECOPS_HSTU_DEFINE_TILE_SCORES_(T, I, ATTR)                                     \
  template <>                                                                           \
  ATTR __attribute__((noinline)) RECOPS_HSTU_TILE_SCORES_SIGNATURE_(T, I) {             \
    TileScoresBody<T, AccumT<T>, I>(p, t, s, b, h, i0, mq, j0, nk, q, kt, dout, vt, w); \
  }
#define RECOPS_HSTU_ENTRIES(I, ATTR)                                     \
  RECOPS_CALL_FLOAT_TYPES_WITH(RECOPS_HSTU_DEFINE_TILE_SCORES_, I, ATTR) \
  namespace {                                                            \
  RECOPS_HSTU_ENTRY(HstuForwardEntry, HstuForwardItem, I, ATTR)          \
  RECOPS_HSTU_ENTRY(HstuBackwardKvEntry, HstuBackwardKvItem, I, ATTR)    \
  RECOPS_HSTU_ENTRY(HstuBackwardQEntry, HstuBackwardQItem, I, ATTR)      \
  RECOPS_HSTU_ENTRY(HstuBackwardSeqEntry, HstuBackwardSeqItem, I, ATTR)  \
  RECOPS_HSTU_ENTRY(HstuPagedDecodeEntry, HstuPagedDecodeItem, I, ATTR)  \
  }                                                                      \
  RECOPS_CALL_FLOAT_TYPES_WITH(RECOPS_HSTU_ENTRIES_FOR, I)

}  // namespace recops

#endif  // RECOPS_KERNELS_HSTU_DENSE_H_
