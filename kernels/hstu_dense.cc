#include "kernels/hstu_dense.h"

namespace recops {

std::vector<HstuItem> HstuWorkItems(const HstuProblem& p, bool kv_side) {
  std::vector<HstuItem> items;
  const int64_t heads = kv_side ? p.heads_k : p.heads_q;
  const int64_t block = kv_side ? kTileK : kTileQ;
  for (int64_t b = 0; b < p.batch; ++b) {
    const HstuSeq s = SeqOf(p, b);
    const int64_t rows = kv_side ? s.lk : s.lq;
    for (int64_t r0 = 0; r0 < rows; r0 += block) {
      // Cost: the tiles this block meets that may be visible.
      int64_t tiles = 0;
      const int64_t other = kv_side ? s.lq : s.lk, other_block = kv_side ? kTileQ : kTileK;
      for (int64_t o0 = 0; o0 < other; o0 += other_block) {
        const int64_t r1 = std::min(r0 + block, rows), o1 = std::min(o0 + other_block, other);
        tiles += kv_side ? HstuTileMaybeVisible(p, s, o0, o1, r0, r1)
                         : HstuTileMaybeVisible(p, s, r0, r1, o0, o1);
      }
      if (kv_side) tiles *= p.heads_q / p.heads_k;
      for (int64_t h = 0; h < heads; ++h) items.push_back({b, h, r0, tiles + 1});
    }
  }
  // Longest sequences first (balance), and within a sequence its items together, head by
  // head, so consecutive items reuse the same key / value tiles from cache.
  std::vector<int64_t> seq_cost(p.batch, 0);
  for (const HstuItem& it : items) seq_cost[it.b] += it.cost;
  std::stable_sort(items.begin(), items.end(), [&](const HstuItem& a, const HstuItem& b) {
    if (seq_cost[a.b] != seq_cost[b.b]) return seq_cost[a.b] > seq_cost[b.b];
    if (a.b != b.b) return a.b < b.b;
    if (a.h != b.h) return a.h < b.h;
    return a.cost > b.cost;
  });
  return items;
}

std::vector<HstuItem> HstuSequenceItems(const HstuProblem& p) {
  std::vector<HstuItem> items;
  for (int64_t b = 0; b < p.batch; ++b) {
    const HstuSeq s = SeqOf(p, b);
    if (s.lq == 0 || s.lk == 0) continue;
    int64_t tiles = 0;
    for (int64_t i0 = 0; i0 < s.lq; i0 += kTileQ) {
      for (int64_t j0 = 0; j0 < s.lk; j0 += kTileK) {
        tiles += HstuTileMaybeVisible(p, s, i0, std::min(i0 + kTileQ, s.lq), j0,
                                      std::min(j0 + kTileK, s.lk));
      }
    }
    for (int64_t h = 0; h < p.heads_k; ++h) items.push_back({b, h, 0, tiles + 1});
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const HstuItem& a, const HstuItem& b) { return a.cost > b.cost; });
  return items;
}

}  // namespace recops
