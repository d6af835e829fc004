// Non-template code of stem hstu_dense: work lists, the baseline x86-64 work items and the
// run-time choice of the work items' instruction set.
#include "kernels/hstu_dense.h"

#include <algorithm>

#include "kernels/common/dispatch.h"

namespace recops {

std::vector<HstuItem> HstuWorkItems(const HstuProblem& p, bool kv_side, int64_t threads) {
  // Cost of every 64-row block of every sequence: the tiles of the other side it may see
  // (times the query heads sharing a kv head on the k side).
  const int64_t heads = kv_side ? p.heads_k : p.heads_q;
  const int64_t per_head = kv_side ? p.heads_q / p.heads_k : 1;
  std::vector<std::vector<int64_t>> block_cost(p.batch);
  int64_t total = 0;
  for (int64_t b = 0; b < p.batch; ++b) {
    const HstuSeq s = SeqOf(p, b);
    const int64_t rows = kv_side ? s.lk : s.lq, other = kv_side ? s.lq : s.lk;
    for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
      const int64_t r1 = std::min(r0 + kTile, rows);
      int64_t tiles = 0;
      for (int64_t o0 = 0; o0 < other; o0 += kTile) {
        const int64_t o1 = std::min(o0 + kTile, other);
        tiles += kv_side ? HstuTileMaybeVisible(p, s, o0, o1, r0, r1)
                         : HstuTileMaybeVisible(p, s, r0, r1, o0, o1);
      }
      block_cost[b].push_back(tiles * per_head + 1);
      total += (tiles * per_head + 1) * heads;
    }
  }
  // Chunks of consecutive blocks of about `target` cost: a whole (sequence, head) unless that
  // is more than 1/8 of a thread's share.
  const int64_t target = std::max<int64_t>(1, total / (8 * std::max<int64_t>(threads, 1)));
  std::vector<HstuItem> items;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t rows = kv_side ? p.off_k[b + 1] - p.off_k[b] : p.off_q[b + 1] - p.off_q[b];
    for (int64_t h = 0; h < heads; ++h) {
      int64_t start = 0, cost = 0;
      for (size_t blk = 0; blk < block_cost[b].size(); ++blk) {
        cost += block_cost[b][blk];
        const int64_t end = std::min<int64_t>((blk + 1) * kTile, rows);
        if (cost >= target || end == rows) {
          items.push_back({b, h, start, end, cost});
          start = end;
          cost = 0;
        }
      }
    }
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const HstuItem& a, const HstuItem& b) { return a.cost > b.cost; });
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
    for (int64_t h = 0; h < p.heads_k; ++h) items.push_back({b, h, 0, s.lk, tiles + 1});
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const HstuItem& a, const HstuItem& b) { return a.cost > b.cost; });
  return items;
}

std::vector<int64_t> HstuGroupBySequence(const HstuProblem& p, bool kv_side, int64_t threads,
                                         std::vector<HstuItem>* items) {
  const int64_t* off = kv_side ? p.off_k : p.off_q;
  std::vector<int64_t> first(p.batch, -1);
  int64_t sequences = 0;
  for (size_t i = 0; i < items->size(); ++i) {
    const HstuItem& item = (*items)[i];
    if (item.row0 != 0 || item.row1 != off[item.b + 1] - off[item.b]) return {};
    if (first[item.b] < 0) {
      first[item.b] = static_cast<int64_t>(i);
      ++sequences;
    }
  }
  if (sequences < 4 * std::max<int64_t>(threads, 1)) return {};
  // Sequences in the order of their first (most expensive) item; a sequence's items keep theirs.
  std::stable_sort(items->begin(), items->end(),
                   [&](const HstuItem& a, const HstuItem& b) { return first[a.b] < first[b.b]; });
  std::vector<int64_t> starts;
  for (size_t i = 0; i < items->size(); ++i) {
    if (i == 0 || (*items)[i].b != (*items)[i - 1].b) starts.push_back(static_cast<int64_t>(i));
  }
  starts.push_back(static_cast<int64_t>(items->size()));
  return starts;
}

// The work items for baseline x86-64 (and any other CPU); AVX2 and AVX-512 in
// kernels/hstu_dense_avx2.cc and kernels/hstu_dense_avx512.cc.
RECOPS_HSTU_ENTRIES(Isa::kBase, )

template <typename T>
const HstuEntries<T>& HstuBestEntries() {
  static const HstuEntries<T> entries = [] {
    switch (BestIsa()) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
      case Isa::kAvx512:
        return HstuEntriesFor<T, Isa::kAvx512>();
      case Isa::kAvx2:
        return HstuEntriesFor<T, Isa::kAvx2>();
#endif
      default:
        return HstuEntriesFor<T, Isa::kBase>();
    }
  }();
  return entries;
}
#define INSTANTIATE(T) template const HstuEntries<T>& HstuBestEntries<T>();
RECOPS_CALL_FLOAT_TYPES(INSTANTIATE)
#undef INSTANTIATE

}  // namespace recops
