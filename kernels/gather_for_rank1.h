// Algorithms of stem gather_for_rank1: a bounds-checked rank-1 gather and its
// deterministic scatter-add adjoint.
#ifndef RECOPS_KERNELS_GATHER_FOR_RANK1_H_
#define RECOPS_KERNELS_GATHER_FOR_RANK1_H_

#include <cstdint>
#include <vector>

#include "kernels/common/validation.h"

namespace recops {

// y[k] = x[index[k]] for k in [k0, k1). Elem is an unsigned integer of the element's width
// (a gather only moves bits). Out-of-range indices are reported to `bad` and skipped.
template <typename Elem, typename Index>
void GatherRange(const Elem* x, int64_t n, const Index* index, Elem* y, int64_t k0, int64_t k1,
                 BadIndexTracker* bad) {
  for (int64_t k = k0; k < k1; ++k) {
    const int64_t j = static_cast<int64_t>(index[k]);
    if (static_cast<uint64_t>(j) < static_cast<uint64_t>(n)) {
      y[k] = x[j];
    } else {
      bad->Report(k, j);
      y[k] = Elem(0);
    }
  }
}

// For j in [j0, j1): acc[j - j0] = sum over k ascending with index[k] == j of grad[k].
// Scanning every k per owner range keeps the summation order independent of threading.
template <typename T, typename Acc, typename Index>
void ScatterAddOwnedRange(const T* grad, const Index* index, int64_t num_index, int64_t n,
                          int64_t j0, int64_t j1, Acc* acc, BadIndexTracker* bad) {
  for (int64_t j = j0; j < j1; ++j) acc[j - j0] = Acc(0);
  for (int64_t k = 0; k < num_index; ++k) {
    const int64_t j = static_cast<int64_t>(index[k]);
    if (j >= j0 && j < j1) {
      acc[j - j0] += static_cast<Acc>(grad[k]);
    } else if (static_cast<uint64_t>(j) >= static_cast<uint64_t>(n)) {
      bad->Report(k, j);
    }
  }
}

}  // namespace recops

#endif  // RECOPS_KERNELS_GATHER_FOR_RANK1_H_
