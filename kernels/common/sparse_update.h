// Shared pieces of the sparse (row-wise) update kernels: fused_lazy_adam, fused_sgd and the
// by-address update of embedding_by_address.
#ifndef RECOPS_KERNELS_COMMON_SPARSE_UPDATE_H_
#define RECOPS_KERNELS_COMMON_SPARSE_UPDATE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
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

// Prefetches the cache lines of [p, p + bytes) (for writing when `write`).
inline void PrefetchBytes(const void* p, int64_t bytes, bool write) {
  const char* c = static_cast<const char*>(p);
  for (int64_t i = 0; i < bytes; i += 64) {
    if (write) {
      __builtin_prefetch(c + i, 1, 3);
    } else {
      __builtin_prefetch(c + i, 0, 3);
    }
  }
}

// Checks `indices` (int32 or int64, shape [N] or [N, 1]): entries >= num_rows are an
// InvalidArgument naming the first one. *rows points at the indices themselves (int64) or at
// their int64 copy in `storage` (int32); negative entries stay as they are (the ForEach helpers
// above skip them).
absl::Status ReadRowIndices(const tensorflow::Tensor& indices, int64_t n, int64_t num_rows,
                            std::vector<int64_t>* storage, const int64_t** rows);

// Checks the scalar float32 learning rate and the [N, dim] float32 gradient of an optimizer op.
absl::Status CheckStepInputs(const tensorflow::Tensor& lr, const tensorflow::Tensor& gradient,
                             int64_t dim, float* lr_value);

// The rows of an optimizer step's [N] int64 addresses into `table` (one per gradient row),
// checked and decoded (-1 for address 0). Caller holds table.mu().
absl::Status DecodeStepAddresses(tensorflow::OpKernelContext* ctx, const DynamicTable& table,
                                 const tensorflow::Tensor& address,
                                 const tensorflow::Tensor& gradient, std::vector<int64_t>* rows);

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

}  // namespace recops

#endif  // RECOPS_KERNELS_COMMON_SPARSE_UPDATE_H_
