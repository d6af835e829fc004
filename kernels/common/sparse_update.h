// Shared pieces of the sparse (row-wise) update kernels: fused_lazy_adam, fused_sgd and the
// by-address update of embedding_by_address.
#ifndef RECOPS_KERNELS_COMMON_SPARSE_UPDATE_H_
#define RECOPS_KERNELS_COMMON_SPARSE_UPDATE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "kernels/common/copy.h"  // PrefetchBytes
#include "kernels/embedding_by_address.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/platform/refcount.h"

namespace tensorflow {
class OpKernelContext;
class Tensor;
}  // namespace tensorflow

namespace recops {

// Calls fn(row, first, next) once for every distinct row >= 0 of rows[0, n) (negative rows are
// skipped); the occurrences of the row are i = first, next[i], next[next[i]], ... in ascending
// order, ending at -1. Rows are split among tasks by ranges of row numbers, so fn never runs
// for the same row twice at once, rows near each other are updated in turn (fewer page-table
// walks), and what fn computes does not depend on the thread count.
// cost_per_row: work of one call of fn (bytes touched is a fair proxy). prefetch(row), if
// given, is called a few distinct rows ahead of fn(row) so that the random row accesses of
// several rows overlap instead of waiting on memory one row at a time.
void ForEachDistinctRow(
    tensorflow::OpKernelContext* ctx, const int64_t* rows, int64_t n, int64_t cost_per_row,
    const std::function<void(int64_t row, int64_t first, const int64_t* next)>& fn,
    const std::function<void(int64_t row)>& prefetch = nullptr);

// Like ForEachDistinctRow, for steps that need each distinct row's summed values: calls
// fn(row, sum, count) with sum = the rows of the [n, dim] matrix `values` at the row's
// occurrences added in ascending order (deterministic) and count = its occurrences.
// The values are read in order while grouping, not by chasing each row's occurrences.
void ForEachDistinctRowSum(
    tensorflow::OpKernelContext* ctx, const int64_t* rows, int64_t n, const float* values,
    int64_t dim, int64_t cost_per_row,
    const std::function<void(int64_t row, const float* sum, int64_t count)>& fn,
    const std::function<void(int64_t row)>& prefetch = nullptr);

// The float32 resource variables of an optimizer op (inputs 0..count-1), locked exclusively
// (in address order, so ops locking the same variables cannot deadlock) for the lifetime of
// this object, each checked initialised, float32 and of the first one's shape, and each made
// safe to update in place: copy-on-read mode as TF's sparse-apply ops set it, and a private
// copy of the buffer when a reader still holds the old one.
class LockedVariables {
 public:
  LockedVariables(tensorflow::OpKernelContext* ctx, int count, const char* const* names);
  ~LockedVariables();
  const absl::Status& status() const { return status_; }
  float* data(int i);
  const tensorflow::Tensor& tensor(int i);

 private:
  std::vector<tensorflow::core::RefCountPtr<tensorflow::Var>> vars_;
  std::vector<tensorflow::Var*> order_;
  absl::Status status_;
};

// The one row resolver of the sparse optimizer ops, by variable and by address: reads and
// checks the step's inputs and says where each updated row's state lives. Both forms take
// [state] lr gradient rows:
//  - by variable: inputs 0..num_state-1 are float32 resource variables of one [rows, dim]
//    shape (the variable, then its slots, named `names`), then lr, gradient [N, dim] and
//    indices [N] or [N, 1] (int32 or int64; negative entries are skipped);
//  - by address: input 0 is a DynamicEmbeddingTable whose rows hold the variable and its
//    num_state - 1 slots side by side, then lr, gradient [N, dim] and address [N] (int64;
//    address 0 is skipped).
// The variables, or the table, stay locked exclusively for the lifetime of this object.
class SparseStepRows {
 public:
  // `optimizer` names the op in errors ("LazyAdam keeps m and v in the table's slots ...").
  SparseStepRows(tensorflow::OpKernelContext* ctx, bool by_address, int num_state,
                 const char* const* names, const char* optimizer);
  ~SparseStepRows();
  SparseStepRows(const SparseStepRows&) = delete;
  SparseStepRows& operator=(const SparseStepRows&) = delete;

  const absl::Status& status() const { return status_; }
  float lr() const { return lr_; }
  int64_t dim() const { return dim_; }
  // The gradient's rows (N) and values ([N, dim] row-major).
  int64_t num_updates() const { return num_updates_; }
  const float* gradient() const { return gradient_; }
  // The row of each gradient row (negative: skipped).
  const int64_t* rows() const { return rows_; }
  // State `s` of row `r` (0: the variable, 1...: its slots), dim floats.
  float* Row(int64_t r, int s) const {
    return table_ ? table_->Row(r) + s * dim_ : base_[s] + r * dim_;
  }

 private:
  absl::Status ByVariable(tensorflow::OpKernelContext* ctx, int num_state,
                          const char* const* names);
  absl::Status ByAddress(tensorflow::OpKernelContext* ctx, int num_state, const char* const* names,
                         const char* optimizer);

  absl::Status status_;
  float lr_ = 0.0f;
  int64_t dim_ = 0, num_updates_ = 0;
  const float* gradient_ = nullptr;
  const int64_t* rows_ = nullptr;
  std::vector<int64_t> storage_;         // int64 copy of int32 indices, or the decoded addresses
  std::optional<LockedVariables> vars_;  // by variable
  std::vector<float*> base_;             // their data (by variable)
  tensorflow::core::RefCountPtr<DynamicTable> table_;  // by address
  bool table_locked_ = false;
};

}  // namespace recops

#endif  // RECOPS_KERNELS_COMMON_SPARSE_UPDATE_H_
