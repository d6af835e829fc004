// Algorithms of stem gather_for_rank1: a bounds-checked rank-1 gather and its
// deterministic scatter-add adjoint.
#ifndef RECOPS_KERNELS_GATHER_FOR_RANK1_H_
#define RECOPS_KERNELS_GATHER_FOR_RANK1_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/common/validation.h"

namespace recops {

// Block of indices validated at once (fits in L1 with its outputs).
constexpr int64_t kGatherBlock = 2048;

// y[k] = x[index[k]] for k in [k0, k1). Elem is an unsigned integer of the element's width
// (a gather only moves bits). Each block of indices is first range-checked with a branch-free
// reduction, then gathered without checks; a block holding a bad index is reported to `bad`
// (lowest bad position) and its outputs are zeroed.
template <typename Elem, typename Index>
__attribute__((always_inline)) inline void GatherRange(const Elem* x, int64_t n, const Index* index, Elem* y, int64_t k0, int64_t k1,
                 BadIndexTracker* bad) {
  const uint64_t bound = static_cast<uint64_t>(n);
  for (int64_t b0 = k0; b0 < k1; b0 += kGatherBlock) {
    const int64_t b1 = std::min(k1, b0 + kGatherBlock);
    uint64_t max_index = 0;  // as unsigned, negative indices are huge
    for (int64_t k = b0; k < b1; ++k) {
      max_index = std::max(max_index, static_cast<uint64_t>(static_cast<int64_t>(index[k])));
    }
    if (max_index < bound) {
      for (int64_t k = b0; k < b1; ++k) y[k] = x[index[k]];
      continue;
    }
    for (int64_t k = b0; k < b1; ++k) {
      const int64_t j = static_cast<int64_t>(index[k]);
      if (static_cast<uint64_t>(j) >= bound) {
        bad->Report(k, j);
        break;
      }
    }
    std::fill(y + b0, y + b1, Elem(0));
  }
}

// For j in [j0, j1): acc[j - j0] = sum over k ascending with index[k] == j of grad[k].
// Scanning every k per owner range keeps the summation order independent of threading. `acc`
// has j1 - j0 + 1 entries: indices owned by other ranges add into the last one (a branch-free
// select instead of an unpredictable branch); its value is meaningless.
template <typename T, typename Acc, typename Index>
void ScatterAddOwnedRange(const T* grad, const Index* index, int64_t num_index, int64_t n,
                          int64_t j0, int64_t j1, Acc* acc, BadIndexTracker* bad) {
  const uint64_t width = static_cast<uint64_t>(j1 - j0);
  std::fill(acc, acc + width + 1, Acc(0));
  uint64_t max_index = 0;
  for (int64_t k = 0; k < num_index; ++k) {
    const int64_t j = static_cast<int64_t>(index[k]);
    max_index = std::max(max_index, static_cast<uint64_t>(j));
    const uint64_t rel = static_cast<uint64_t>(j - j0);
    acc[rel < width ? rel : width] += static_cast<Acc>(grad[k]);
  }
  if (max_index >= static_cast<uint64_t>(n)) {
    for (int64_t k = 0; k < num_index; ++k) {
      const int64_t j = static_cast<int64_t>(index[k]);
      if (static_cast<uint64_t>(j) >= static_cast<uint64_t>(n)) {
        bad->Report(k, j);
        break;
      }
    }
  }
}

}  // namespace recops

#endif  // RECOPS_KERNELS_GATHER_FOR_RANK1_H_
