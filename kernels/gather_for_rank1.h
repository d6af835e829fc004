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
__attribute__((always_inline)) inline void GatherRange(const Elem* x, int64_t n, const Index* index,
                                                       Elem* y, int64_t k0, int64_t k1,
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

// Deterministic scatter-add in fixed chunks: index positions are split into chunks whose
// boundaries depend only on (num_index, n), never on the thread count. Chunk c accumulates
// its k in ascending order into its own dense accumulator; the final sum adds the chunks in
// ascending c. So results are bitwise reproducible on any machine and thread count, and with a
// single chunk (num_index <= kMinChunk) they equal the plain ascending-k sum.
constexpr int64_t kMinChunk = 1 << 16;
constexpr int64_t kMaxChunks = 16;
constexpr int64_t kAccumulatorBudgetBytes = int64_t{64} << 20;

inline int64_t ScatterAddChunks(int64_t num_index, int64_t n, int64_t acc_bytes) {
  const int64_t by_work = std::max<int64_t>(1, num_index / kMinChunk);
  const int64_t by_memory =
      std::max<int64_t>(1, kAccumulatorBudgetBytes / std::max<int64_t>(1, n * acc_bytes));
  return std::min({kMaxChunks, by_work, by_memory});
}

// acc[j] += grad[k] for k in [k0, k1), ascending; out-of-range indices go to `bad`.
template <typename T, typename Acc, typename Index>
void ScatterAddChunk(const T* grad, const Index* index, int64_t n, int64_t k0, int64_t k1, Acc* acc,
                     BadIndexTracker* bad) {
  const uint64_t bound = static_cast<uint64_t>(n);
  for (int64_t k = k0; k < k1; ++k) {
    const uint64_t j = static_cast<uint64_t>(static_cast<int64_t>(index[k]));
    if (j < bound) {
      acc[j] += static_cast<Acc>(grad[k]);
    } else {
      bad->Report(k, static_cast<int64_t>(index[k]));
    }
  }
}

}  // namespace recops

#endif  // RECOPS_KERNELS_GATHER_FOR_RANK1_H_
