// The slice plan of stem multislice_concat: which input columns land in which output
// columns. Shared by the forward (gather of column slices) and the adjoint (scatter-add).
#ifndef RECOPS_KERNELS_MULTISLICE_CONCAT_H_
#define RECOPS_KERNELS_MULTISLICE_CONCAT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace recops {

struct ColumnSlice {
  int64_t output;      // which output tensor
  int64_t out_column;  // first column in that output
  int64_t begin;       // first input column
  int64_t length;      // number of columns
};

class MultislicePlan {
 public:
  // Validates the attributes that do not depend on the input (counts, signs).
  absl::Status Init(int64_t num_outputs, const std::vector<int64_t>& concat_sizes,
                    const std::vector<int64_t>& slice_begins,
                    const std::vector<int64_t>& slice_lengths);

  // Resolves length -1 against `columns` and checks every slice lies inside [0, columns).
  // Fills slices() and widths().
  absl::Status Resolve(int64_t columns, std::vector<ColumnSlice>* slices,
                       std::vector<int64_t>* widths) const;

 private:
  std::vector<int64_t> concat_sizes_, begins_, lengths_;
};

}  // namespace recops

#endif  // RECOPS_KERNELS_MULTISLICE_CONCAT_H_
