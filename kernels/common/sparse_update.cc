#include "kernels/common/sparse_update.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/common/parallel.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/tensor.h"

namespace recops {

using tensorflow::OpKernelContext;
using tensorflow::Tensor;

namespace {

inline uint64_t HashRow(int64_t row) {
  uint64_t x = static_cast<uint64_t>(row) * 0x9E3779B97F4A7C15ull;
  return x ^ (x >> 29);
}

// Sorts positions by (rows[i], i): a stable LSD radix sort on the row, 11 bits per pass, so
// equal rows end up adjacent with their positions ascending, and rows are visited in address
// order (monotonic memory access instead of random).
void SortByRow(const int64_t* rows, std::vector<int64_t>* positions) {
  int64_t max_row = 0;
  for (int64_t i : *positions) max_row = std::max(max_row, rows[i]);
  const int bits = 64 - __builtin_clzll(static_cast<uint64_t>(max_row) | 1);
  constexpr int kBits = 11;
  constexpr int64_t kBuckets = int64_t{1} << kBits;
  // Per-thread scratch, kept between calls (no allocation, no page faults per step).
  thread_local std::vector<int64_t> other, start;
  other.resize(positions->size());
  start.resize(kBuckets);
  for (int shift = 0; shift < bits; shift += kBits) {
    std::fill(start.begin(), start.end(), 0);
    for (int64_t i : *positions) ++start[(rows[i] >> shift) & (kBuckets - 1)];
    int64_t sum = 0;
    for (int64_t& c : start) {
      const int64_t count = c;
      c = sum;
      sum += count;
    }
    for (int64_t i : *positions) other[start[(rows[i] >> shift) & (kBuckets - 1)]++] = i;
    positions->swap(other);
  }
}

// Runs body(mine) once per task, in parallel (tasks handed out dynamically), where mine lists the positions i whose
// rows[i] >= 0 belong to the task, sorted by (row, position): rows are split among tasks by a
// hash, so every row has one task and each position is read by one task only.
template <typename Body>
void RunRowTasks(OpKernelContext* ctx, const int64_t* rows, int64_t n, int64_t cost_per_row,
                 const Body& body) {
  if (n == 0) return;
  // Several tasks per thread, handed out one at a time, so a thread that starts late does not
  // hold the step up; each position is still read by one task only.
  const int64_t tasks =
      n * cost_per_row < 65536
          ? 1
          : std::max<int64_t>(1, std::min<int64_t>(8 * NumThreads(ctx), n / 256));
  std::vector<std::vector<int64_t>> mine(tasks);
  for (auto& m : mine) m.reserve(n / tasks + 16);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = rows[i];
    // The top bits of the row's hash scaled to [0, tasks) (no division).
    if (r >= 0) mine[((HashRow(r) >> 32) * tasks) >> 32].push_back(i);
  }
  const auto run = [&](int64_t task) {
    SortByRow(rows, &mine[task]);
    body(mine[task]);
  };
  if (tasks == 1) {
    run(0);
  } else {
    ParallelForDynamic(ctx, tasks, run);
  }
}

// Calls visit(k) for k in [0, size) with prefetch(k + kAhead) issued ahead of it.
template <typename Visit, typename Prefetch>
void VisitWithPrefetch(size_t size, const Visit& visit, const Prefetch& prefetch) {
  constexpr size_t kAhead = 8;  // rows in flight
  for (size_t k = 0; k < std::min(kAhead, size); ++k) prefetch(k);
  for (size_t k = 0; k < size; ++k) {
    if (k + kAhead < size) prefetch(k + kAhead);
    visit(k);
  }
}

}  // namespace

void ForEachDistinctRow(
    OpKernelContext* ctx, const int64_t* rows, int64_t n, int64_t cost_per_row,
    const std::function<void(int64_t row, int64_t first, const int64_t* next)>& fn,
    const std::function<void(int64_t row)>& prefetch) {
  std::vector<int64_t> next(n, -1);
  RunRowTasks(ctx, rows, n, cost_per_row, [&](const std::vector<int64_t>& mine) {
    thread_local std::vector<int64_t> firsts;
    firsts.clear();
    for (size_t k = 0; k < mine.size(); ++k) {
      if (k > 0 && rows[mine[k]] == rows[mine[k - 1]]) {
        next[mine[k - 1]] = mine[k];
      } else {
        firsts.push_back(mine[k]);
      }
    }
    VisitWithPrefetch(
        firsts.size(), [&](size_t k) { fn(rows[firsts[k]], firsts[k], next.data()); },
        [&](size_t k) {
          if (prefetch) prefetch(rows[firsts[k]]);
        });
  });
}

void ForEachDistinctRowSum(
    OpKernelContext* ctx, const int64_t* rows, int64_t n, const float* values, int64_t dim,
    int64_t cost_per_row,
    const std::function<void(int64_t row, const float* sum, int64_t count)>& fn,
    const std::function<void(int64_t row)>& prefetch) {
  RunRowTasks(ctx, rows, n, cost_per_row + 8 * dim, [&](const std::vector<int64_t>& mine) {
    // Per distinct row: the row, its first occurrence, its count, and where its sum is (-1
    // when it occurs once: the sum is then its value, not copied).
    struct Distinct {
      int64_t row, first, count, sum;
    };
    thread_local std::vector<Distinct> distinct;
    thread_local std::vector<float> sums;
    distinct.clear();
    sums.clear();
    for (size_t k = 0; k < mine.size(); ++k) {
      const int64_t i = mine[k];
      if (k == 0 || rows[i] != rows[mine[k - 1]]) {
        distinct.push_back(Distinct{rows[i], i, 1, -1});
        continue;
      }
      // A repeated row: its values are added in ascending position order.
      Distinct& d = distinct.back();
      if (d.sum < 0) {
        d.sum = static_cast<int64_t>(sums.size());
        sums.insert(sums.end(), values + d.first * dim, values + (d.first + 1) * dim);
      }
      float* __restrict sum = sums.data() + d.sum;
      const float* __restrict src = values + i * dim;
      for (int64_t c = 0; c < dim; ++c) sum[c] += src[c];
      ++d.count;
    }
    VisitWithPrefetch(
        distinct.size(),
        [&](size_t k) {
          const Distinct& d = distinct[k];
          fn(d.row, d.sum < 0 ? values + d.first * dim : sums.data() + d.sum, d.count);
        },
        [&](size_t k) {
          const Distinct& d = distinct[k];
          PrefetchBytes(d.sum < 0 ? values + d.first * dim : sums.data() + d.sum,
                        dim * static_cast<int64_t>(sizeof(float)), false);
          if (prefetch) prefetch(d.row);
        });
  });
}

absl::Status ReadRowIndices(const Tensor& indices, int64_t n, int64_t num_rows,
                            std::vector<int64_t>* rows) {
  const bool column = indices.dims() == 2 && indices.dim_size(1) == 1;
  if (!(indices.dims() == 1 || column) || indices.NumElements() != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "indices must have shape [N] or [N, 1] with N = gradient rows = ", n, ", got ",
        indices.shape().DebugString()));
  }
  rows->resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = indices.dtype() == tensorflow::DT_INT32
                          ? static_cast<int64_t>(indices.flat<int32_t>()(i))
                          : indices.flat<int64_t>()(i);
    if (r >= num_rows) {
      return absl::InvalidArgumentError(absl::StrCat(
          "indices[", i, "] = ", r, " is out of range [0, ", num_rows,
          ") (negative indices are skipped)"));
    }
    (*rows)[i] = r < 0 ? -1 : r;
  }
  return absl::OkStatus();
}

absl::Status CheckStepInputs(const Tensor& lr, const Tensor& gradient, int64_t dim,
                             float* lr_value) {
  if (lr.dims() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("lr must be a scalar, got shape ", lr.shape().DebugString()));
  }
  *lr_value = lr.scalar<float>()();
  if (!std::isfinite(*lr_value)) {
    return absl::InvalidArgumentError(absl::StrCat("lr must be finite, got ", *lr_value));
  }
  if (gradient.dims() != 2 || gradient.dim_size(1) != dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient must have shape [N, ", dim, "], got ",
                     gradient.shape().DebugString()));
  }
  return absl::OkStatus();
}

absl::Status DecodeStepAddresses(OpKernelContext* ctx, const DynamicTable& table,
                                 const Tensor& address, const Tensor& gradient,
                                 std::vector<int64_t>* rows) {
  if (address.dims() != 1 || address.dim_size(0) != gradient.dim_size(0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("address must be a vector of gradient's ", gradient.dim_size(0),
                     " rows, got shape ", address.shape().DebugString()));
  }
  return table.DecodeAddresses(ctx, address.flat<int64_t>().data(), address.dim_size(0),
                               "address", rows);
}

LockedVariables::LockedVariables(OpKernelContext* ctx, int count, const char* const* names)
    : vars_(count) {
  for (int i = 0; i < count; ++i) {
    status_ = tensorflow::LookupResource(ctx, tensorflow::HandleFromInput(ctx, i), &vars_[i]);
    if (!status_.ok()) {
      status_ = absl::InvalidArgumentError(
          absl::StrCat(names[i], " must be a resource variable: ", status_.message()));
      vars_.resize(i);
      return;
    }
    for (int j = 0; j < i; ++j) {
      if (vars_[j].get() == vars_[i].get()) {
        status_ = absl::InvalidArgumentError(
            absl::StrCat(names[j], " and ", names[i], " are the same variable"));
        vars_.resize(i + 1);
        return;
      }
    }
  }
  for (auto& v : vars_) order_.push_back(v.get());
  std::sort(order_.begin(), order_.end(), [](tensorflow::Var* a, tensorflow::Var* b) {
    return a->mu() < b->mu();
  });
  for (tensorflow::Var* v : order_) v->mu()->lock();
  for (int i = 0; i < count; ++i) {
    tensorflow::Var* var = vars_[i].get();
    Tensor* t = var->tensor();
    if (!var->is_initialized) {
      status_ = absl::FailedPreconditionError(absl::StrCat(names[i], " is not initialized"));
      return;
    }
    if (t->dtype() != tensorflow::DT_FLOAT) {
      status_ = absl::InvalidArgumentError(absl::StrCat(
          names[i], " must be float32, got ", tensorflow::DataTypeString(t->dtype())));
      return;
    }
    if (t->dims() != 2 || (i > 0 && t->shape() != vars_[0]->tensor()->shape())) {
      status_ = absl::InvalidArgumentError(
          absl::StrCat(names[i], " must be a matrix", i > 0 ? " of var's shape " : "",
                       i > 0 ? vars_[0]->tensor()->shape().DebugString() : "", ", got ",
                       t->shape().DebugString()));
      return;
    }
    var->copy_on_read_mode.store(true);
    if (!t->RefCountIsOne()) {
      Tensor copy;
      status_ = ctx->allocate_temp(tensorflow::DT_FLOAT, t->shape(), &copy);
      if (!status_.ok()) return;
      std::memcpy(copy.data(), t->data(), t->TotalBytes());
      *t = copy;
    }
  }
}

LockedVariables::~LockedVariables() {
  for (auto it = order_.rbegin(); it != order_.rend(); ++it) (*it)->mu()->unlock();
}

float* LockedVariables::data(int i) { return vars_[i]->tensor()->flat<float>().data(); }

const Tensor& LockedVariables::tensor(int i) { return *vars_[i]->tensor(); }

}  // namespace recops
