// Row layout of a concatenated pair of jagged tensors.
//
// Sample b of the output holds, in order: the first q_b = min(prefix, lenB_b) rows of B,
// all rows of A, then the remaining lenB_b - q_b rows of B, and starts at output row
// off_a[b] + off_b[b]. Concat copies pieces A/B -> out, split copies out -> A/B; both walk
// the same pieces, so the layout lives here once.
#ifndef RECOPS_KERNELS_CONCAT_JAGGED_TENSOR_H_
#define RECOPS_KERNELS_CONCAT_JAGGED_TENSOR_H_

#include <algorithm>
#include <cstdint>
#include <vector>

namespace recops {

class JaggedConcatLayout {
 public:
  // off_a and off_b are validated offsets of equal length B+1.
  JaggedConcatLayout(const std::vector<int64_t>& off_a, const std::vector<int64_t>& off_b,
                     int64_t prefix)
      : off_a_(off_a), off_b_(off_b), prefix_(prefix) {}

  int64_t rows() const { return off_a_.back() + off_b_.back(); }

  // Calls visit(out_row, from_b, src_row, n) for every contiguous piece of the output rows
  // [r0, r1), in output order: n rows starting at out_row come from rows [src_row,
  // src_row + n) of B (from_b) or A.
  template <typename Visit>
  void ForEachPiece(int64_t r0, int64_t r1, Visit&& visit) const {
    if (r0 >= r1) return;
    const int64_t num_samples = static_cast<int64_t>(off_a_.size()) - 1;
    // First sample whose output range ends after r0.
    int64_t lo = 0, hi = num_samples;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (off_a_[mid + 1] + off_b_[mid + 1] <= r0)
        lo = mid + 1;
      else
        hi = mid;
    }
    for (int64_t b = lo; b < num_samples; ++b) {
      int64_t out = off_a_[b] + off_b_[b];
      if (out >= r1) break;
      const int64_t len_b = off_b_[b + 1] - off_b_[b];
      const int64_t q = std::min(prefix_, len_b);
      const struct {
        bool from_b;
        int64_t src, n;
      } pieces[3] = {{true, off_b_[b], q},
                     {false, off_a_[b], off_a_[b + 1] - off_a_[b]},
                     {true, off_b_[b] + q, len_b - q}};
      for (const auto& p : pieces) {
        const int64_t begin = std::max(out, r0), end = std::min(out + p.n, r1);
        if (begin < end) visit(begin, p.from_b, p.src + (begin - out), end - begin);
        out += p.n;
      }
    }
  }

 private:
  const std::vector<int64_t>& off_a_;
  const std::vector<int64_t>& off_b_;
  const int64_t prefix_;
};

}  // namespace recops

#endif  // RECOPS_KERNELS_CONCAT_JAGGED_TENSOR_H_
